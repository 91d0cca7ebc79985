// The model of a golden fixture's config, built as `hetrain train` builds it
// (runtime::build_model, which the image and text tasks call too), but without loading
// any data: the fixtures carry their own batches, so neither the helper that writes the
// initial weights nor the unit test needs a dataset on disk.
#pragma once

#include "config/config.h"
#include "nn/block.h"
#include "runtime/task.h"

namespace ht::golden {

inline nn::Sequential build_model(const config::Config& cfg) {
  return runtime::build_model(cfg, cfg.train.seed);
}

}  // namespace ht::golden
