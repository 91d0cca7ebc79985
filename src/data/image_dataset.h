// Labelled image classification data held in host memory, and the Fashion-MNIST
// loader (Debian package dataset-fashion-mnist).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ht::data {

// Fashion-MNIST pixel statistics over the training set (of x/255), used to normalise
// inputs to roughly zero mean and unit variance.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr int64_t kFashionMnistClasses = 10;
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct ImageDataset {
  int64_t channels = 1, height = 28, width = 28;
  int64_t num_classes = 10;
  std::vector<float> images;    // (N, channels, height, width), normalised float32
  std::vector<int32_t> labels;  // (N), each in [0, num_classes)

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t sample_numel() const { return channels * height * width; }
  const float* image(int64_t i) const { return images.data() + i * sample_numel(); }
};

// Pixels (x/255 - mean)/std, written into `out` (same count as `pixels`).
void normalize_pixels(const std::vector<uint8_t>& pixels, float mean, float std, float* out);

// One split from a gzipped IDX image file and its label file: checks 28x28 images,
// equal counts and labels in [0, 10). Errors name the offending file.
ImageDataset load_fashion_mnist_split(const std::string& images_path,
                                      const std::string& labels_path);

struct FashionMnist {
  ImageDataset train;  // 60000 samples
  ImageDataset test;   // 10000 samples
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir`. A missing directory
// or file names the Debian package that provides them.
FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDir);

}  // namespace ht::data
