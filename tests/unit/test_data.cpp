// src/data: IDX reading through zlib, Fashion-MNIST, the byte-level text corpus, the
// position-addressed samplers with unequal shares, and batch building.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/batch.h"
#include "data/idx_file.h"
#include "data/image_dataset.h"
#include "data/sampler.h"
#include "data/text_corpus.h"

using namespace ht;
using namespace ht::data;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("ht_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

std::vector<uint8_t> images_idx(uint32_t count, uint32_t rows, uint32_t cols,
                                uint32_t magic = kIdxImagesMagic) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  // Pixel j of image i: (i * 7 + j) mod 256, so every image differs.
  for (uint32_t i = 0; i < count; ++i)
    for (uint32_t j = 0; j < rows * cols; ++j) b.push_back(static_cast<uint8_t>((i * 7 + j) % 256));
  return b;
}

std::vector<uint8_t> labels_idx(const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> b;
  put_be32(b, kIdxLabelsMagic);
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<uint8_t> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A complete synthetic Fashion-MNIST directory: 3 train and 2 test samples.
void write_fashion_dir(const TempDir& d) {
  write_gz(d.file("train-images-idx3-ubyte.gz"), images_idx(3, 28, 28));
  write_gz(d.file("train-labels-idx1-ubyte.gz"), labels_idx({0, 9, 4}));
  write_gz(d.file("t10k-images-idx3-ubyte.gz"), images_idx(2, 28, 28));
  write_gz(d.file("t10k-labels-idx1-ubyte.gz"), labels_idx({7, 1}));
}

float normalized(int x) { return (static_cast<float>(x) / 255.f - 0.2860f) / 0.3530f; }

}  // namespace

// ---------------------------------------------------------------- Fashion-MNIST / IDX

TEST_CASE("data: synthetic gzipped IDX files load with the right shapes and normalisation") {
  TempDir d;
  write_fashion_dir(d);
  const FashionMnist fm = load_fashion_mnist(d.path.string());
  REQUIRE(fm.train.size() == 3);
  REQUIRE(fm.test.size() == 2);
  CHECK(fm.train.labels == std::vector<int32_t>{0, 9, 4});
  CHECK(fm.test.labels == std::vector<int32_t>{7, 1});
  CHECK(fm.train.images.size() == 3u * 784u);
  CHECK(fm.train.sample_numel() == 784);
  for (int i : {0, 1, 2})
    for (int j : {0, 1, 255, 300, 783})
      CHECK(fm.train.image(i)[j] == doctest::Approx(normalized((i * 7 + j) % 256)).epsilon(1e-6));
  CHECK(normalized(0) == doctest::Approx(-0.2860f / 0.3530f));

  const std::vector<int64_t> idx{2, 0};
  const ImageBatch b = make_image_batch(fm.train, idx, cpu_backend());
  CHECK(b.inputs.shape() == Shape{2, 1, 28, 28});
  CHECK(b.inputs.dtype() == DType::f32);
  CHECK(b.labels.shape() == Shape{2});
  CHECK(b.labels.dtype() == DType::i32);
  CHECK(b.labels.to_ints() == std::vector<int32_t>{4, 0});
  const auto x = b.inputs.to_vector();
  CHECK(x[0] == fm.train.image(2)[0]);
  CHECK(x[784 + 5] == fm.train.image(0)[5]);
  CHECK_THROWS_WITH_AS(make_image_batch(fm.train, std::vector<int64_t>{3}, cpu_backend()),
                       doctest::Contains("sample index 3"), Error);
}

TEST_CASE("data: broken IDX files give errors naming the file and the problem") {
  TempDir d;
  write_fashion_dir(d);
  const std::string images = d.file("train-images-idx3-ubyte.gz");
  const std::string labels = d.file("train-labels-idx1-ubyte.gz");
  const auto load = [&] { return load_fashion_mnist(d.path.string()); };
  const auto expect_error = [&](const std::string& file, const std::string& what) {
    try {
      load();
      FAIL("no error for ", what);
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(file) != std::string::npos);
      CHECK(msg.find(what) != std::string::npos);
    }
  };

  SUBCASE("wrong magic") {
    write_gz(images, images_idx(3, 28, 28, 0x00000801));
    expect_error(images, "wrong IDX magic number 0x00000801; expected 0x00000803");
  }
  SUBCASE("truncated gzip stream") {
    const auto gz = read_raw(images);
    write_raw(images, std::vector<uint8_t>(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)));
    expect_error(images, "truncated gzip stream");
  }
  SUBCASE("corrupt gzip stream") {
    auto gz = read_raw(images);
    for (size_t i = 12; i < gz.size() - 8; ++i) gz[i] = static_cast<uint8_t>(0xFF ^ (i * 31));
    write_raw(images, gz);
    expect_error(images, "gzip");
  }
  SUBCASE("not gzipped") {
    write_raw(images, images_idx(3, 28, 28));
    expect_error(images, "not a gzip stream");
  }
  SUBCASE("short payload") {
    auto raw = images_idx(3, 28, 28);
    raw.resize(raw.size() - 100);
    write_gz(images, raw);
    expect_error(images, "payload holds 2252 bytes but the header promises 2352 (file is truncated)");
  }
  SUBCASE("header cut short") {
    write_gz(labels, {0, 0, 8});
    expect_error(labels, "IDX header is cut short");
  }
  SUBCASE("wrong image size") {
    write_gz(images, images_idx(3, 28, 27));
    expect_error(images, "images are 28x27; expected 28x28");
  }
  SUBCASE("count mismatch names both files") {
    write_gz(labels, labels_idx({0, 1}));
    expect_error(images, "holds 3 images but");
    expect_error(labels, "holds 2 labels");
  }
  SUBCASE("label out of range") {
    write_gz(labels, labels_idx({0, 10, 4}));
    expect_error(labels, "label 10 at index 1 is out of range; expected 0 <= label < 10");
  }
  SUBCASE("missing file names the package") {
    fs::remove(d.file("t10k-labels-idx1-ubyte.gz"));
    expect_error(d.file("t10k-labels-idx1-ubyte.gz"),
                 "not found; the Fashion-MNIST files come from the Debian package "
                 "dataset-fashion-mnist; install it with: apt-get install dataset-fashion-mnist");
  }
  SUBCASE("missing directory names the package") {
    const std::string missing = d.file("nope");
    CHECK_THROWS_WITH_AS(load_fashion_mnist(missing),
                         doctest::Contains((missing + " not found").c_str()), Error);
    CHECK_THROWS_WITH_AS(load_fashion_mnist(missing),
                         doctest::Contains("install it with: apt-get install dataset-fashion-mnist"),
                         Error);
  }
  SUBCASE("a directory that is a file, and a file that is a directory, are said to be so, not missing") {
    const std::string plain = d.file("plain");
    std::ofstream(plain) << "x";
    CHECK_THROWS_WITH_AS(load_fashion_mnist(plain),
                         doctest::Contains((plain + " is a regular file; expected a directory holding").c_str()), Error);
    fs::remove(d.file("t10k-images-idx3-ubyte.gz"));
    fs::create_directory(d.file("t10k-images-idx3-ubyte.gz"));
    expect_error(d.file("t10k-images-idx3-ubyte.gz"), "is a directory; expected a regular file");
    CHECK_THROWS_WITH_AS(read_gzip_file(d.file("t10k-images-idx3-ubyte.gz")),
                         doctest::Contains("is not a regular file; expected a gzip-compressed IDX file"), Error);
  }
  SUBCASE("the gzip reader alone names a missing file") {
    CHECK_THROWS_WITH_AS(read_gzip_file(d.file("absent.gz")),
                         doctest::Contains((d.file("absent.gz") + ": file not found").c_str()), Error);
  }
}

// In the meson test unit-fashion-mnist, which is skipped where the dataset is absent
// (tests/unit/main.cpp).
TEST_CASE("data: the real Fashion-MNIST loads 60000/10000 with balanced classes" *
          doctest::test_suite("needs-fashion-mnist")) {
  const auto t0 = std::chrono::steady_clock::now();
  const FashionMnist fm = load_fashion_mnist();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("Fashion-MNIST loaded in ", secs, " s");
  REQUIRE(fm.train.size() == 60000);
  REQUIRE(fm.test.size() == 10000);
  CHECK(fm.train.images.size() == 60000u * 784u);
  for (const auto* split : {&fm.train, &fm.test}) {
    std::vector<int64_t> counts(10, 0);
    for (int32_t l : split->labels) ++counts[static_cast<size_t>(l)];
    for (int64_t c : counts) CHECK(c == split->size() / 10);
  }
  // The normalisation constants are the training set's pixel mean and std.
  double sum = 0, sq = 0;
  for (float v : fm.train.images) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(fm.train.images.size());
  const double mean = sum / n;
  CHECK(std::abs(mean) < 0.01);
  CHECK(std::sqrt(sq / n - mean * mean) == doctest::Approx(1.0).epsilon(0.01));
}

// ---------------------------------------------------------------- text

TEST_CASE("data: the byte tokenizer maps 96 symbols and round-trips ASCII") {
  CHECK(kByteVocab == 96);
  CHECK(byte_to_token('\n') == 0);
  CHECK(byte_to_token(' ') == 1);
  CHECK(byte_to_token('!') == 2);
  CHECK(byte_to_token('~') == 95);
  CHECK(byte_to_token('\t') == byte_to_token(' '));
  const uint8_t q = byte_to_token('?');
  CHECK(q == 32);
  for (int c : {0, 1, 8, 13, 27, 127, 0x80, 0xC3, 0xA9, 0xFF})
    CHECK(byte_to_token(static_cast<unsigned char>(c)) == q);

  std::string all = "\n";
  for (char c = ' '; c <= '~'; ++c) all += c;
  const auto ids = encode(all);
  REQUIRE(ids.size() == 96);
  for (size_t i = 0; i < ids.size(); ++i) CHECK(ids[i] == i);
  CHECK(decode(ids) == all);
  const std::vector<int32_t> ids32(ids.begin(), ids.end());
  CHECK(decode(ids32) == all);
  // Non-ASCII degrades byte by byte: "é" is two UTF-8 bytes, so two '?'.
  CHECK(decode(encode("caf\xC3\xA9\tok\r\n")) == "caf?? ok?\n");
  CHECK_THROWS_WITH_AS(decode(std::vector<int32_t>{5, 96}),
                       doctest::Contains("token id 96 is out of range"), Error);
}

TEST_CASE("data: text corpus reads files and directories in order and splits the tail") {
  TempDir d;
  fs::create_directories(d.path / "dir" / "sub");
  write_text(d.file("dir/b.txt"), "bbbb\n");
  write_text(d.file("dir/a.txt"), "aaaa\n");
  write_text(d.file("dir/a.txt.dat"), "SKIPPED");
  write_text(d.file("dir/c.u8"), "SKIPPED");
  write_text(d.file("dir/sub/x.txt"), "NOT RECURSED");
  write_text(d.file("single"), "0123456789");

  const std::vector<std::string> paths{d.file("dir"), d.file("single")};
  const std::vector<std::string> skip{".dat", ".u8"};
  const TextCorpus c = load_text_corpus(paths, skip, 0.25, 3);
  REQUIRE(c.files.size() == 3);
  CHECK(fs::path(c.files[0]).filename() == "a.txt");
  CHECK(fs::path(c.files[1]).filename() == "b.txt");
  CHECK(c.files[2] == d.file("single"));
  CHECK(c.total_tokens == 20);
  CHECK(c.train.size() == 15);
  CHECK(c.validation.size() == 5);
  CHECK(decode(c.train) + decode(c.validation) == "aaaa\nbbbb\n0123456789");
  CHECK(decode(c.validation) == "56789");

  const TextCorpus no_val = load_text_corpus(paths, skip, 0.0, 3);
  CHECK(no_val.validation.empty());
  CHECK(no_val.train.size() == 20);

  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("missing")}, {}, 0.1, 2),
                       doctest::Contains((d.file("missing") + " not found").c_str()), Error);
  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("missing")}, {}, 0.1, 2),
                       doctest::Contains("fortunes provides /usr/share/games/fortunes"), Error);
  // A file reached twice would be trained on twice as often; a device is no corpus.
  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("single"), d.file("single")}, {}, 0.1, 2),
                       doctest::Contains((d.file("single") + " is reached twice through data.paths").c_str()), Error);
  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("dir"), d.file("dir/a.txt")}, skip, 0.1, 2),
                       doctest::Contains("a.txt is reached twice"), Error);
  fs::create_symlink(d.file("single"), d.file("alias"));
  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("single"), d.file("alias")}, {}, 0.1, 2),
                       doctest::Contains((d.file("alias") + " is the same file as " + d.file("single")).c_str()), Error);
  CHECK_THROWS_WITH_AS(load_text_corpus({"/dev/null"}, {}, 0.1, 2),
                       doctest::Contains("/dev/null is not a regular file or a directory"), Error);
  // A hard link is the same file too (one device and inode).
  fs::create_hard_link(d.file("single"), d.file("hard"));
  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("single"), d.file("hard")}, {}, 0.1, 2),
                       doctest::Contains((d.file("hard") + " is the same file as " + d.file("single")).c_str()), Error);
  // In a directory, links to nothing and loops are no files: passed over wherever they
  // fall in its order (one once made the whole directory "cannot list"). Given itself, a
  // loop is named as what it is, not as a missing package.
  fs::create_directories(d.path / "links");
  write_text(d.file("links/m.txt"), "mmmm");
  for (const char* name : {"a-broken", "z-broken"}) fs::create_symlink(d.file("nowhere"), d.file(std::string("links/") + name));
  fs::create_symlink(d.file("links/zz-loop"), d.file("links/zz-loop"));
  const TextCorpus linked = load_text_corpus({d.file("links")}, {}, 0.0, 1);
  REQUIRE(linked.files.size() == 1);
  CHECK(decode(linked.train) == "mmmm");
  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("links/zz-loop")}, {}, 0.1, 2),
                       doctest::Contains("links/zz-loop cannot be read (Too many levels of symbolic links)"), Error);
  // Read to its end, not to the size stat gives (0 for a file of procfs).
  CHECK(load_text_corpus({"/proc/self/status"}, {}, 0.0, 1).train.size() > 10);
  fs::create_directories(d.path / "empty");
  write_text(d.file("empty/skip.dat"), "x");
  CHECK_THROWS_WITH_AS(load_text_corpus({d.file("empty")}, skip, 0.1, 2),
                       doctest::Contains(("text corpus is empty: 0 file(s) read from " + d.file("empty")).c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(load_text_corpus(paths, skip, 0.25, 6),
                       doctest::Contains("validation split has 5 tokens"), Error);
  CHECK_THROWS_WITH_AS(load_text_corpus(paths, skip, 0.25, 16),
                       doctest::Contains("train split has 15 tokens (of 20); expected at least 16"),
                       Error);
  CHECK_THROWS_WITH_AS(load_text_corpus(paths, skip, 1.0, 1),
                       doctest::Contains("validation_fraction 1 is out of range"), Error);
}

TEST_CASE("data: text batches shift targets by one; evaluation uses stride-context windows") {
  const auto tokens = encode("abcdefghijk");  // 11 tokens
  const std::vector<int64_t> starts{0, 7};
  const TextBatch b = make_text_batch(tokens, starts, 3, cpu_backend());
  CHECK(b.inputs.shape() == Shape{2, 3});
  CHECK(b.targets.shape() == Shape{2, 3});
  CHECK(b.inputs.dtype() == DType::i32);
  CHECK(decode(b.inputs.to_ints()) == "abchij");
  CHECK(decode(b.targets.to_ints()) == "bcdijk");
  CHECK_THROWS_WITH_AS(make_text_batch(tokens, std::vector<int64_t>{8}, 3, cpu_backend()),
                       doctest::Contains("window start 8 at position 0 is out of range"), Error);

  // 11 tokens, context 3: windows at 0, 3, 6 (the one at 9 would need token 12).
  TextEvalIterator it(tokens, 3, 2, 0, cpu_backend());
  CHECK(it.total() == 3);
  TextBatch e;
  REQUIRE(it.next(e));
  CHECK(decode(e.inputs.to_ints()) == "abcdef");
  CHECK(decode(e.targets.to_ints()) == "bcdefg");
  REQUIRE(it.next(e));
  CHECK(e.size() == 1);
  CHECK(decode(e.targets.to_ints()) == "hij");
  CHECK(!it.next(e));
  CHECK(TextEvalIterator(tokens, 3, 2, 2, cpu_backend()).total() == 2);
  CHECK(TextEvalIterator(encode("abcd"), 3, 2, 0, cpu_backend()).total() == 1);
  CHECK_THROWS_AS(TextEvalIterator(encode("abc"), 3, 2, 0, cpu_backend()), Error);
}

TEST_CASE("data: image evaluation iterates the split in order, capped at max_samples") {
  TempDir d;
  write_gz(d.file("i.gz"), images_idx(7, 28, 28));
  write_gz(d.file("l.gz"), labels_idx({0, 1, 2, 3, 4, 5, 6}));
  const ImageDataset ds = load_fashion_mnist_split(d.file("i.gz"), d.file("l.gz"));
  std::vector<int32_t> seen;
  std::vector<int64_t> sizes;
  ImageEvalIterator it(ds, 3, 0, cpu_backend());
  ImageBatch b;
  while (it.next(b)) {
    sizes.push_back(b.size());
    for (int32_t l : b.labels.to_ints()) seen.push_back(l);
  }
  CHECK(sizes == std::vector<int64_t>{3, 3, 1});
  CHECK(seen == ds.labels);
  ImageEvalIterator capped(ds, 4, 5, cpu_backend());
  CHECK(capped.total() == 5);
  REQUIRE(capped.next(b));
  REQUIRE(capped.next(b));
  CHECK(b.size() == 1);
  CHECK(b.labels.to_ints() == std::vector<int32_t>{4});
  CHECK(!capped.next(b));
}

// ---------------------------------------------------------------- samplers

TEST_CASE("data: ShuffledSampler is deterministic and each epoch is a permutation") {
  const int64_t n = 17;
  ShuffledSampler a(n, 42), b(n, 42), other(n, 43);
  const auto sa = a.at_range(0, 5 * n);
  CHECK(sa == b.at_range(0, 5 * n));
  CHECK(sa != other.at_range(0, 5 * n));
  std::set<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 5; ++e) {
    std::vector<int64_t> ep(sa.begin() + e * n, sa.begin() + (e + 1) * n);
    epochs.insert(ep);
    std::sort(ep.begin(), ep.end());
    for (int64_t i = 0; i < n; ++i) CHECK(ep[static_cast<size_t>(i)] == i);
  }
  CHECK(epochs.size() == 5);  // reshuffled every epoch

  // Random access reproduces the stream, from any epoch, in any order.
  ShuffledSampler c(n, 42);
  CHECK(c.at(4 * n + 3) == sa[static_cast<size_t>(4 * n + 3)]);
  CHECK(c.at(2) == sa[2]);
  CHECK(c.at_range(2 * n - 4, n + 9) ==
        std::vector<int64_t>(sa.begin() + 2 * n - 4, sa.begin() + 3 * n + 5));
  CHECK_THROWS_AS(c.at(-1), Error);
  CHECK_THROWS_AS(c.at_range(-1, 2), Error);
  CHECK_THROWS_AS(ShuffledSampler(0, 1), Error);
}

TEST_CASE("data: WindowSampler starts are in range and counter-based") {
  const int64_t num_tokens = 12, window = 5;  // starts 0 .. 7
  WindowSampler w(num_tokens, window, 3);
  CHECK(w.num_starts() == 8);
  const auto starts = w.at_range(0, 4000);
  std::vector<int64_t> hits(8, 0);
  for (int64_t s : starts) {
    REQUIRE(s >= 0);
    REQUIRE(s <= num_tokens - window);
    ++hits[static_cast<size_t>(s)];
  }
  for (int64_t h : hits) CHECK(h > 400);  // ~500 each: roughly uniform, every start reached
  WindowSampler again(num_tokens, window, 3), other(num_tokens, window, 4);
  CHECK(again.at(1234) == starts[1234]);
  CHECK(again.at_range(100, 3) == std::vector<int64_t>(starts.begin() + 100, starts.begin() + 103));
  CHECK(other.at_range(0, 100) != std::vector<int64_t>(starts.begin(), starts.begin() + 100));
  CHECK(WindowSampler(5, 5, 1).at(99) == 0);

  // Text batches straight from sampler positions.
  const auto tokens = encode("hello world");
  WindowSampler ws(static_cast<int64_t>(tokens.size()), 4, 9);
  const TextBatch b = make_text_batch(tokens, ws, 10, 6, 3, cpu_backend());
  CHECK(b.inputs.shape() == Shape{6, 3});
  const auto x = b.inputs.to_ints();
  const auto y = b.targets.to_ints();
  for (int64_t i = 0; i < 6; ++i) {
    const int64_t s = ws.at(10 + i);
    for (int64_t t = 0; t < 3; ++t) {
      CHECK(x[static_cast<size_t>(i * 3 + t)] == tokens[static_cast<size_t>(s + t)]);
      CHECK(y[static_cast<size_t>(i * 3 + t)] == tokens[static_cast<size_t>(s + t + 1)]);
    }
  }
  CHECK_THROWS_WITH_AS(WindowSampler(4, 5, 1), doctest::Contains("4 tokens cannot hold a window of 5"),
                       Error);
}

TEST_CASE("data: a large corpus holds out validation text from all over it") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("hetrain-spread-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // Ten files of 16384 bytes, each one letter: a tail split would validate on 'i' and
  // 'j' only; ten segments of 4096 (kValidationSegment) reach every file.
  for (char letter = 'a'; letter <= 'j'; ++letter) {
    std::ofstream f(dir / std::string(1, letter));
    f << std::string(16384, letter);
  }
  TextCorpus c = load_text_corpus({dir.string()}, {}, 0.25, 129);
  fs::remove_all(dir);
  CHECK(c.validation.size() == 40960);
  CHECK(c.train.size() + c.validation.size() == 163840);
  std::string val = decode(c.validation), train = decode(c.train);
  for (char letter = 'a'; letter <= 'j'; ++letter) {
    CAPTURE(letter);
    CHECK(val.find(letter) != std::string::npos);
    CHECK(train.find(letter) != std::string::npos);
  }
  // Exactly: each file's first 12288 bytes train and its last 4096 validate, in order
  // (the train split is the read buffer, its segments moved down over those tails).
  std::string want_train, want_val;
  for (char letter = 'a'; letter <= 'j'; ++letter) {
    want_train += std::string(12288, letter);
    want_val += std::string(4096, letter);
  }
  CHECK(train == want_train);
  CHECK(val == want_val);
}
