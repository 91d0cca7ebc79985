// Parameter creation with seeded initialisation. Every layer draws from an ht::Rng
// handed in by the model builder, in construction order, so one seed fixes a model.
#pragma once

#include "core/rng.h"
#include "tensor/tensor.h"

namespace ht::nn {

// How a Linear or Conv2d layer initialises itself.
enum class Init {
  torch_default,  // weight and bias uniform in +-1/sqrt(fan_in), as PyTorch's defaults
  gpt,            // weight normal(0, 0.02), bias 0, as GPT-2
};

inline constexpr float kGptInitStd = 0.02f;

// Leaf tensors that require a gradient, made in host memory (the CPU backend, by name):
// the values are drawn on the host, every rank builds the whole model from one seed,
// and each rank moves the blocks it computes with onto its device (Tensor::rehome, in
// the executor), so a model larger than one device is still built identically.
Tensor uniform_parameter(const Shape& shape, float bound, Rng& rng);  // U(-bound, bound)
Tensor normal_parameter(const Shape& shape, float stddev, Rng& rng);  // N(0, stddev^2)
Tensor constant_parameter(const Shape& shape, float value);

}  // namespace ht::nn
