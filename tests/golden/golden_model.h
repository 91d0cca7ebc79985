// The model of a golden fixture's config, built as `hetrain train` builds it (the same
// spec fields the image and text tasks read), but without loading any data: the
// fixtures carry their own batches, so neither the helper that writes the initial
// weights nor the unit test needs a dataset on disk.
#pragma once

#include "config/config.h"
#include "data/text_corpus.h"
#include "models/models.h"
#include "nn/block.h"

namespace ht::golden {

inline nn::Sequential build_model(const config::Config& cfg) {
  const config::ModelConfig& m = cfg.model;
  if (m.type == "gpt") {
    models::GptSpec spec;
    spec.vocab = data::kByteVocab;
    spec.context = m.context;
    spec.layers = m.layers;
    spec.heads = m.heads;
    spec.d_model = m.d_model;
    spec.dropout = m.dropout;
    return models::build_gpt(spec, cfg.train.seed);
  }
  if (m.type == "cnn") {
    models::CnnSpec spec;
    spec.channels = m.channels;
    spec.hidden = m.fc_hidden;
    return models::build_cnn(spec, cfg.train.seed);
  }
  models::MlpSpec spec;
  spec.hidden = m.hidden;
  return models::build_mlp(spec, cfg.train.seed);
}

}  // namespace ht::golden
