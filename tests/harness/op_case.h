// The op consistency harness: one OpCase per op. A case says how to build random
// inputs, how to run the op on any backend (the fast path under test) and how to
// compute the same thing with plain loops in double precision (the reference).
// consistency.h checks every case three ways: forward against the reference,
// gradients against central finite differences of the reference, and any backend
// against the CPU backend.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ht::harness {

using Values = std::vector<double>;

struct InputSpec {
  enum class Kind { real, mask, index };  // mask: 0/1 float32; index: int32 in [0, bound)
  Shape shape;
  Kind kind = Kind::real;
  double lo = -1.0, hi = 1.0;  // range of real values
  double min_abs = 0.0;        // keeps real values this far from 0 (kinks of relu, ...)
  int32_t bound = 0;           // index range

  bool differentiable() const { return kind == Kind::real; }
};

struct OpCase {
  std::string name;
  std::vector<InputSpec> inputs;
  // Runs the op on tensors that live on any backend; the result must be float32.
  std::function<Tensor(const std::vector<Tensor>&)> run;
  // The same function with plain loops in double; returns the output's values in
  // row-major order (the output shape is taken from run()).
  std::function<Values(const std::vector<Values>&)> reference;
  // Normalised max errors allowed (see normalized_error in consistency.h). float32
  // rounding over these small cases stays below 3e-7 for every op on the CPU; the
  // limits leave about 30x headroom for other summation orders (BLAS kernels, GPUs)
  // while still catching a wrong term in any derivative.
  double forward_tol = 1e-5;
  double grad_tol = 1e-5;
};

const std::vector<OpCase>& all_op_cases();

}  // namespace ht::harness
