// Model builders: a small spec and a seed become a Sequential of Blocks. The seed
// drives one ht::Rng that every layer draws its initial values from in construction
// order (and that hands each block its dropout seed), so (spec, seed) fixes a model.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/block.h"

namespace ht::models {

// 784-512-512-10 ReLU by default. The first block flattens, so it takes (B, 784) or
// images (B, 1, 28, 28).
struct MlpSpec {
  int64_t input = 784;
  std::vector<int64_t> hidden{512, 512};
  int64_t classes = 10;
};

// Per entry of `channels`: conv 3x3 pad 1 + ReLU + max-pool 2; then Linear -> hidden
// + ReLU, Linear -> classes. Defaults: (B, 1, 28, 28) -> 32 -> 64 -> 3136 -> 128 -> 10.
struct CnnSpec {
  int64_t in_channels = 1;
  int64_t image = 28;  // square images
  std::vector<int64_t> channels{32, 64};
  int64_t hidden = 128;
  int64_t classes = 10;
};

// Pre-LN GPT with a learned position embedding, GELU MLP 4x and an untied head:
// ids int32 (B, T), T <= context -> logits (B, T, vocab).
struct GptSpec {
  int64_t vocab = 96;
  int64_t context = 128;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t d_model = 128;
  float dropout = 0.f;
};

nn::Sequential build_mlp(const MlpSpec& spec, uint64_t seed);
nn::Sequential build_cnn(const CnnSpec& spec, uint64_t seed);
nn::Sequential build_gpt(const GptSpec& spec, uint64_t seed);

}  // namespace ht::models
