// A Task for executor-level tests: an MLP over synthetic data that is a pure function of
// the stream position, so every rank and every reference computes the same batches
// without a dataset. Input j of sample i is wave(a * i + b * j) (wave: sin or cos); its
// label is (i * label_stride) mod the class count.
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "models/models.h"
#include "runtime/task.h"
#include "tensor/tensor.h"

namespace ht::testing {

struct SyntheticData {
  float a = 0.37f, b = 1.3f;
  bool cosine = false;
  int64_t label_stride = 7;
};

class SyntheticMlpTask : public runtime::TrainingOnlyTask {
 public:
  // widths: input, the hidden layers, classes.
  SyntheticMlpTask(std::vector<int64_t> widths, SyntheticData data)
      : TrainingOnlyTask(cpu_backend()), widths_(std::move(widths)), data_(data) {}

  nn::Sequential build_model(uint64_t seed) const override {
    models::MlpSpec spec;
    spec.input = widths_.front();
    spec.hidden.assign(widths_.begin() + 1, widths_.end() - 1);
    spec.classes = widths_.back();
    return models::build_mlp(spec, seed);
  }
  int64_t train_size() const override { return 1 << 20; }
  int64_t predictions_per_sample() const override { return 1; }
  runtime::Batch train_batch(int64_t first, int64_t count) override {
    const int64_t in = widths_.front(), classes = widths_.back();
    std::vector<float> x;
    std::vector<int32_t> y;
    x.reserve(static_cast<size_t>(count * in));
    for (int64_t i = first; i < first + count; ++i) {
      for (int64_t j = 0; j < in; ++j) {
        const float t = data_.a * static_cast<float>(i) + data_.b * static_cast<float>(j);
        x.push_back(data_.cosine ? std::cos(t) : std::sin(t));
      }
      y.push_back(static_cast<int32_t>((i * data_.label_stride) % classes));
    }
    return {Tensor::from_vector(x, {count, in}, cpu_backend()), Tensor::from_ints(y, {count}, cpu_backend())};
  }

 private:
  std::vector<int64_t> widths_;
  SyntheticData data_;
};

}  // namespace ht::testing
