#include "runtime/task.h"

#include "data/text_corpus.h"
#include "models/models.h"
#include "ops/ops.h"
#include "runtime/image_task.h"
#include "runtime/text_task.h"

namespace ht::runtime {

nn::Sequential build_model(const config::Config& cfg, uint64_t seed) {
  const config::ModelConfig& m = cfg.model;
  if (m.type == "gpt") {
    models::GptSpec spec;
    spec.vocab = data::kByteVocab;
    spec.context = m.context;
    spec.layers = m.layers;
    spec.heads = m.heads;
    spec.d_model = m.d_model;
    spec.dropout = m.dropout;
    return models::build_gpt(spec, seed);
  }
  if (m.type == "cnn") {
    models::CnnSpec spec;
    spec.channels = m.channels;
    spec.hidden = m.fc_hidden;
    return models::build_cnn(spec, seed);
  }
  models::MlpSpec spec;
  spec.hidden = m.hidden;
  return models::build_mlp(spec, seed);
}

std::unique_ptr<Task> make_task(const config::Config& cfg) {
  if (cfg.data.dataset == "text") return std::make_unique<TextTask>(cfg);
  return std::make_unique<ImageTask>(cfg);
}

Tensor summed_loss(const Tensor& logits, const Tensor& targets) {
  int64_t classes = logits.shape().back();
  return cross_entropy(reshape(logits, {-1, classes}), reshape(targets, {-1}), Reduction::sum);
}

}  // namespace ht::runtime
