#include "nn/init.h"

#include <vector>

namespace ht::nn {

namespace {
Tensor parameter_from(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::from_vector(values, shape, cpu_backend());
  t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor uniform_parameter(const Shape& shape, float bound, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (float& x : v) x = rng.uniform(-bound, bound);
  return parameter_from(v, shape);
}

Tensor normal_parameter(const Shape& shape, float stddev, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (float& x : v) x = rng.normal(0.f, stddev);
  return parameter_from(v, shape);
}

Tensor constant_parameter(const Shape& shape, float value) {
  std::vector<float> v(static_cast<size_t>(numel(shape)), value);
  return parameter_from(v, shape);
}

}  // namespace ht::nn
