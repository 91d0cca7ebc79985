#pragma once

#include "data/image_dataset.h"
#include "data/sampler.h"
#include "runtime/task.h"

namespace ht::runtime {

class ImageTask final : public Task {
 public:
  ImageTask(const config::Config& cfg, Backend& device);

  nn::Sequential build_model(uint64_t seed) const override;
  int64_t train_size() const override { return data_.train.size(); }
  int64_t predictions_per_sample() const override { return 1; }
  Batch train_batch(int64_t first, int64_t count) override;
  int64_t eval_chunks() const override;
  std::vector<double> evaluate_chunks(const nn::Sequential& model, int64_t first, int64_t end) const override;
  size_t eval_sums_per_chunk() const override { return 3; }
  EvalResult eval_result(const std::vector<double>& sums) const override;

 private:
  const config::Config& cfg_;
  data::FashionMnist data_;
  data::ShuffledSampler sampler_;
};

}  // namespace ht::runtime
