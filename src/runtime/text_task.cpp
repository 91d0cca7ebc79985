#include "runtime/text_task.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"
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

int64_t TextTask::eval_chunks() const {
  return data::TextEvalIterator(corpus_.validation, cfg_.model.context, cfg_.train.eval_batch_size,
                                cfg_.train.eval_max_samples, device())
      .chunks();
}

// Each chunk's summed loss (nats) and predicted tokens.
std::vector<double> TextTask::evaluate_chunks(const nn::Sequential& model, int64_t first, int64_t end) const {
  data::TextEvalIterator it(corpus_.validation, cfg_.model.context, cfg_.train.eval_batch_size,
                            cfg_.train.eval_max_samples, device());
  it.seek_chunk(first);
  data::TextBatch b;
  std::vector<double> sums;
  for (int64_t chunk = first; chunk < end && it.next(b); ++chunk)
    sums.insert(sums.end(), {static_cast<double>(summed_loss(model.forward(b.inputs), b.targets).item()),
                             static_cast<double>(b.targets.numel())});
  return sums;
}

EvalResult TextTask::eval_result(const std::vector<double>& sums) const {
  HT_CHECK(sums.size() % 2 == 0, "TextTask: ", sums.size(), " evaluation sums; expected 2 a chunk");
  double nats = 0, tokens = 0;
  for (size_t k = 0; k < sums.size(); k += 2) nats += sums[k], tokens += sums[k + 1];
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
