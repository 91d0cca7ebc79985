#include "data/image_dataset.h"

#include <filesystem>

#include "core/error.h"
#include "data/idx_file.h"

namespace ht::data {

namespace {

constexpr const char* kInstallHint =
    "the Fashion-MNIST files come from the Debian package dataset-fashion-mnist; "
    "install it with: apt-get install dataset-fashion-mnist";

}  // namespace

void normalize_pixels(const std::vector<uint8_t>& pixels, float mean, float std, float* out) {
  // One multiply-add per pixel: (x/255 - mean)/std == x * scale + shift.
  const float scale = 1.f / (255.f * std);
  const float shift = -mean / std;
  const size_t n = pixels.size();
  const uint8_t* in = pixels.data();
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * scale + shift;
}

ImageDataset load_fashion_mnist_split(const std::string& images_path,
                                      const std::string& labels_path) {
  IdxImages img = read_idx_images(images_path);
  HT_CHECK(img.rows == 28 && img.cols == 28, images_path, ": images are ", img.rows, "x",
           img.cols, "; expected 28x28");
  IdxLabels lab = read_idx_labels(labels_path);
  const int64_t n_labels = static_cast<int64_t>(lab.labels.size());
  HT_CHECK(img.count == n_labels, images_path, " holds ", img.count, " images but ",
           labels_path, " holds ", n_labels, " labels; expected equal counts");
  ImageDataset ds;
  ds.num_classes = kFashionMnistClasses;
  ds.labels.resize(lab.labels.size());
  for (size_t i = 0; i < lab.labels.size(); ++i) {
    const int v = lab.labels[i];
    HT_CHECK(v < kFashionMnistClasses, labels_path, ": label ", v, " at index ", i,
             " is out of range; expected 0 <= label < ", kFashionMnistClasses);
    ds.labels[i] = v;
  }
  ds.images.resize(img.pixels.size());
  normalize_pixels(img.pixels, kFashionMnistMean, kFashionMnistStd, ds.images.data());
  return ds;
}

FashionMnist load_fashion_mnist(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // What is there, where it is not what was expected: "not found" for a file that exists
  // sent a user looking for a missing package.
  const auto what_is = [](const fs::path& p, const char* expected) -> std::string {
    std::error_code e;
    const fs::file_status st = fs::status(p, e);
    if (!fs::exists(st)) return "not found";
    const char* is = fs::is_directory(st)      ? "is a directory"
                     : fs::is_regular_file(st) ? "is a regular file"
                                               : "is not a regular file (a device, pipe or socket)";
    return std::string(is) + "; expected " + expected;
  };
  HT_CHECK(fs::is_directory(dir, ec), "Fashion-MNIST directory ", dir, " ",
           what_is(dir, "a directory holding the four IDX files"), "; ", kInstallHint);
  const fs::path d(dir);
  const auto file = [&](const char* name) {
    const std::string p = (d / name).string();
    HT_CHECK(fs::is_regular_file(p, ec), "Fashion-MNIST file ", p, " ", what_is(p, "a regular file"), "; ",
             kInstallHint);
    return p;
  };
  // Check all four up front so a partial install fails before the slow reads.
  const std::string train_images = file("train-images-idx3-ubyte.gz");
  const std::string train_labels = file("train-labels-idx1-ubyte.gz");
  const std::string test_images = file("t10k-images-idx3-ubyte.gz");
  const std::string test_labels = file("t10k-labels-idx1-ubyte.gz");
  FashionMnist r;
  r.train = load_fashion_mnist_split(train_images, train_labels);
  r.test = load_fashion_mnist_split(test_images, test_labels);
  return r;
}

}  // namespace ht::data
