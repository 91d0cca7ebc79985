#include <memory>

#include "core/error.h"
#include "core/rng.h"
#include "models/models.h"
#include "nn/conv_block.h"
#include "nn/dense_block.h"

namespace ht::models {

nn::Sequential build_cnn(const CnnSpec& spec, uint64_t seed) {
  HT_CHECK(spec.in_channels > 0 && spec.image > 0 && spec.hidden > 0 && spec.classes > 0,
           "cnn spec: in_channels ", spec.in_channels, ", image ", spec.image, ", hidden ",
           spec.hidden, ", classes ", spec.classes, "; expected all positive");
  Rng rng(seed);
  nn::Sequential model;
  int64_t c = spec.in_channels, side = spec.image;
  for (int64_t out : spec.channels) {
    HT_CHECK(out > 0, "cnn spec: channel count ", out, "; expected positive");
    HT_CHECK(side >= 2, "cnn spec: ", spec.channels.size(), " pooling stages shrink a ",
             spec.image, "x", spec.image, " image below 2x2; expected fewer stages");
    auto block = std::make_unique<nn::ConvBlock>(c, out, side, side, rng);
    Shape next = block->sample_output_shape();  // (out, side/2, side/2)
    model.add(std::move(block));
    c = out;
    side = next[1];
  }
  // The classifier flattens the (C, S, S) feature maps.
  model.add(std::make_unique<nn::DenseBlock>(Shape{c, side, side}, spec.hidden, true, true, rng));
  model.add(std::make_unique<nn::DenseBlock>(Shape{spec.hidden}, spec.classes, false, false, rng));
  return model;
}

}  // namespace ht::models
