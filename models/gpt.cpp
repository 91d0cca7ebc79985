#include <memory>

#include "core/error.h"
#include "core/rng.h"
#include "models/models.h"
#include "nn/lm_head_block.h"
#include "nn/token_embedding_block.h"
#include "nn/transformer_block.h"

namespace ht::models {

nn::Sequential build_gpt(const GptSpec& spec, uint64_t seed) {
  HT_CHECK(spec.vocab > 0 && spec.context > 0 && spec.layers >= 0 && spec.d_model > 0,
           "gpt spec: vocab ", spec.vocab, ", context ", spec.context, ", layers ", spec.layers,
           ", d_model ", spec.d_model, "; expected positive sizes (layers may be 0)");
  HT_CHECK(spec.heads > 0 && spec.d_model % spec.heads == 0, "gpt spec: ", spec.heads,
           " heads for d_model ", spec.d_model, "; expected a positive divisor of d_model");
  HT_CHECK(spec.dropout >= 0.f && spec.dropout < 1.f, "gpt spec: dropout ", spec.dropout,
           "; expected 0 <= dropout < 1");
  Rng rng(seed);
  nn::Sequential model;
  // Each block's dropout seed is drawn before its weights, so every block has its own
  // mask stream whether or not dropout is on (the weights do not depend on it).
  uint64_t drop_seed = rng.next_u64();
  model.add(std::make_unique<nn::TokenEmbeddingBlock>(spec.vocab, spec.context, spec.d_model,
                                                      spec.dropout, drop_seed, rng));
  for (int64_t i = 0; i < spec.layers; ++i) {
    drop_seed = rng.next_u64();
    model.add(std::make_unique<nn::TransformerBlock>(spec.d_model, spec.heads, spec.context,
                                                     spec.dropout, drop_seed, rng));
  }
  model.add(std::make_unique<nn::LmHeadBlock>(spec.d_model, spec.vocab, spec.context, rng));
  return model;
}

}  // namespace ht::models
