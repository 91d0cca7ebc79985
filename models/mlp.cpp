#include <memory>

#include "core/error.h"
#include "core/rng.h"
#include "models/models.h"
#include "nn/dense_block.h"

namespace ht::models {

nn::Sequential build_mlp(const MlpSpec& spec, uint64_t seed) {
  HT_CHECK(spec.input > 0 && spec.classes > 0, "mlp spec: input ", spec.input, ", classes ",
           spec.classes, "; expected both positive");
  for (int64_t h : spec.hidden)
    HT_CHECK(h > 0, "mlp spec: hidden size ", h, "; expected every hidden size positive");
  Rng rng(seed);
  nn::Sequential model;
  int64_t in = spec.input;
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    // Only the first block flattens: later inputs are already (B, features).
    model.add(std::make_unique<nn::DenseBlock>(Shape{in}, spec.hidden[i], true, i == 0, rng));
    in = spec.hidden[i];
  }
  model.add(std::make_unique<nn::DenseBlock>(Shape{in}, spec.classes, false,
                                             spec.hidden.empty(), rng));
  return model;
}

}  // namespace ht::models
