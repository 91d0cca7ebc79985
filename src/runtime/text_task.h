#pragma once

#include "data/sampler.h"
#include "data/text_corpus.h"
#include "runtime/task.h"

namespace ht::runtime {

// Next-byte prediction on a text corpus with the GPT.
class TextTask final : public Task {
 public:
  TextTask(const config::Config& cfg, Backend& device);

  nn::Sequential build_model(uint64_t seed) const override;
  // One epoch: as many windows as fit in the training split end to end.
  int64_t train_size() const override;
  int64_t predictions_per_sample() const override { return cfg_.model.context; }
  Batch train_batch(int64_t first, int64_t count) override;
  int64_t eval_chunks() const override;
  std::vector<double> evaluate_chunks(const nn::Sequential& model, int64_t first, int64_t end) const override;
  size_t eval_sums_per_chunk() const override { return 2; }
  EvalResult eval_result(const std::vector<double>& sums) const override;

 private:
  const config::Config& cfg_;
  data::TextCorpus corpus_;
  data::WindowSampler sampler_;
};

}  // namespace ht::runtime
