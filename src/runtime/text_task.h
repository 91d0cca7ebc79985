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
  EvalResult evaluate(const nn::Sequential& model) const override;

 private:
  const config::Config& cfg_;
  data::TextCorpus corpus_;
  data::WindowSampler sampler_;
};

}  // namespace ht::runtime
