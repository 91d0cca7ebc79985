// Every op case of the harness on GPU 0: against the CPU backend on the same inputs,
// against the double-precision reference, and its gradients against finite differences;
// plus the paths the harness does not reach (an empty GEMM sum, the device's input checks).
#include <doctest/doctest.h>

#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "ops/ops.h"
#include "tests/harness/consistency.h"

using namespace ht;
using namespace ht::harness;

namespace {
cuda::CudaBackend& gpu() { return cuda::cuda_backend(0); }
}  // namespace

TEST_CASE("cuda ops: every case matches the CPU, its reference and finite differences") {
  for (const OpCase& c : all_op_cases()) {
    CAPTURE(c.name);
    for (uint64_t seed : {1u, 2u}) {
      Report vs_cpu = check_against_cpu(c, gpu(), seed);
      CHECK_MESSAGE(vs_cpu.ok, vs_cpu.detail);
      Report f = check_forward(c, gpu(), seed);
      CHECK_MESSAGE(f.ok, f.detail);
      Report g = check_gradients(c, gpu(), seed);
      CHECK_MESSAGE(g.ok, g.detail);
      MESSAGE(c.name << " seed " << seed << ": vs cpu " << vs_cpu.worst << ", forward "
                     << f.worst << ", gradient " << g.worst);
    }
  }
  gpu().synchronize();
}

TEST_CASE("cuda ops: a GEMM with an empty sum leaves beta * C") {
  // C (2, 3) = A (2, 0) @ B (0, 3) + beta * C: cuBLAS is called with k = 0.
  Tensor c = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, gpu());
  Tensor none = Tensor::zeros({1}, gpu());
  for (float beta : {0.5f, 0.f}) {
    GemmArgs g;
    g.m = 2, g.n = 3, g.k = 0;
    g.beta = beta;
    g.a = none.data(), g.b = none.data(), g.c = c.data();
    g.lda = 0, g.ldb = 3, g.ldc = 3;
    std::vector<float> before = c.to_vector();
    gpu().gemm(g);
    std::vector<float> after = c.to_vector();
    for (size_t i = 0; i < after.size(); ++i) CHECK(after[i] == before[i] * beta);
  }
}

TEST_CASE("cuda ops: a label or id out of range is an error naming the op, after which the "
          "device works on") {
  Tensor logits = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3}, gpu());
  Tensor bad_labels = Tensor::from_ints({0, 3}, {2}, gpu());
  CHECK_THROWS_WITH_AS(cross_entropy(logits, bad_labels).to_vector(),
                       doctest::Contains("cross_entropy on cuda:0: a label is out of range; "
                                         "expected 0 <= label < 3"),
                       Error);
  Tensor table = Tensor::from_vector({1, 2, 3, 4}, {2, 2}, gpu());
  Tensor bad_ids = Tensor::from_ints({1, -1}, {2}, gpu());
  CHECK_THROWS_WITH_AS(embedding(table, bad_ids).to_vector(),
                       doctest::Contains("embedding on cuda:0: an id is out of range; expected "
                                         "0 <= id < 2"),
                       Error);
  // The flags were cleared: good input passes, and its values are right.
  Tensor ids = Tensor::from_ints({1, 0}, {2}, gpu());
  CHECK(embedding(table, ids).to_vector() == std::vector<float>{3, 4, 1, 2});
  CHECK_NOTHROW(gpu().synchronize());
}
