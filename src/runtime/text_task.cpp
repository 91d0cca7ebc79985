#include "runtime/text_task.h"

#include <cmath>
#include <cstdio>

#include "data/batch.h"
#include "ops/ops.h"

namespace ht::runtime {

TextTask::TextTask(const config::Config& cfg, Backend& device)
    : Task(device),
      cfg_(cfg),
      corpus_(data::load_text_corpus(cfg.data.paths, cfg.data.skip_suffixes,
                                     cfg.data.validation_fraction, cfg.model.context + 1)),
      sampler_(static_cast<int64_t>(corpus_.train.size()), cfg.model.context + 1,
               cfg.train.seed) {}

nn::Sequential TextTask::build_model(uint64_t seed) const {
  return runtime::build_model(cfg_, seed);
}

int64_t TextTask::train_size() const {
  return static_cast<int64_t>(corpus_.train.size()) / cfg_.model.context;
}

Batch TextTask::train_batch(int64_t first, int64_t count) {
  data::TextBatch b = data::make_text_batch(corpus_.train, sampler_, first, count, cfg_.model.context,
                                           device());
  return {b.inputs, b.targets};
}

EvalResult TextTask::evaluate(const nn::Sequential& model) const {
  data::TextEvalIterator it(corpus_.validation, cfg_.model.context, cfg_.train.eval_batch_size,
                            cfg_.train.eval_max_samples, device());
  data::TextBatch b;
  double nats = 0, tokens = 0;
  while (it.next(b)) {
    nats += summed_loss(model.forward(b.inputs), b.targets).item();
    tokens += static_cast<double>(b.targets.numel());
  }
  // One token per byte (data/text_corpus.h), so bits per token are bits per byte.
  double loss = nats / tokens, bpb = loss / std::log(2.0);
  EvalResult r;
  r.metrics = {{"val_loss", loss}, {"val_bpb", bpb}, {"val_tokens", tokens}};
  char line[128];
  std::snprintf(line, sizeof line, "validation loss %.4f nats, %.3f bits per byte (%.0f bytes)",
                loss, bpb, tokens);
  r.line = line;
  return r;
}

}  // namespace ht::runtime
