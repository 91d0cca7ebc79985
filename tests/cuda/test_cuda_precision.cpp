// train.precision bf16 and fp16 on GPU 0: the backend's gemm in each mode against a CPU
// reference that rounds the operands the same way (round to nearest even,
// backend/precision.h) and sums in double; every op case of the harness within the
// issue's 1e-2 of the CPU; and, below sm_80, bf16's refusal. bf16's cases are skipped
// (with a message) on a GPU without bf16 tensor cores. Unverified: compiled without a
// GPU, not yet run on one.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/precision.h"
#include "core/error.h"
#include "tests/harness/consistency.h"

using namespace ht;

namespace {

cuda::CudaBackend& gpu() { return cuda::cuda_backend(0); }
bool has_bf16() { return gpu().capability_major() >= 8; }

// The GPU in a reduced precision for one scope, back to fp32 at its end whatever happens.
struct Mode {
  explicit Mode(Precision p) { gpu().set_precision(p); }
  ~Mode() { gpu().set_precision(Precision::fp32); }
};

// The operand rounding of a mode and its unit roundoff.
struct Rounding {
  float (*round)(float);
  double roundoff;
};
constexpr Rounding kBf16{round_to_bf16, kBf16Roundoff};
constexpr Rounding kFp16{round_to_fp16, kFp16Roundoff};

struct Product {
  bool trans_a, trans_b;
  int64_t m, n, k, batch;
  float alpha, beta;
};

// Values with full 24-bit mantissas in [-1, 1): none is a bf16 or a half, so rounding
// shows (and none overflows a half).
std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(count);
  for (float& x : v) x = u(rng);
  return v;
}

struct Outcome {
  double worst_vs_rounded = 0;  // max |gpu - rounded reference| / its element's bound
  double worst_vs_fp32 = 0;  // the same against the unrounded reference and fp32's bound
};

// Runs `p` on the GPU in the backend's current mode and compares every element of C with
// the two references: operands rounded by `rounding` and not, both summed in double.
//
// Bounds, per element, with S = |alpha| sum_r |a_r b_r| + |beta c|:
// - against the rounded reference only the GPU's fp32 accumulation is left: (k + 2) u32 S
//   for k products summed and the alpha, beta steps, u32 = 2^-24; plus one roundoff of the
//   mode (bf16 2^-8, fp16 2^-11) S for a kernel that rounds a partial sum or converts an
//   operand otherwise than to nearest (cuBLAS does not document its conversion's rounding);
// - against the unrounded reference, fp32 throughout: (k + 2) u32 S.
// A reduced product fails the second by up to 2 x roundoff x S (two rounded operands per
// term): 2 x 2^-11 is still far above (k + 2) 2^-24 for these k (at most 514 x 2^-24 =
// 2^-15), so the fp32 check tells the modes apart.
Outcome run_product(const Product& p, uint32_t seed, Rounding rounding = kBf16) {
  const int64_t rows_a = p.trans_a ? p.k : p.m, cols_a = p.trans_a ? p.m : p.k;
  const int64_t rows_b = p.trans_b ? p.n : p.k, cols_b = p.trans_b ? p.k : p.n;
  const int64_t size_a = rows_a * cols_a, size_b = rows_b * cols_b, size_c = p.m * p.n;
  const std::vector<float> a = random_values(static_cast<size_t>(size_a * p.batch), seed);
  const std::vector<float> b = random_values(static_cast<size_t>(size_b * p.batch), seed + 1);
  const std::vector<float> c0 = random_values(static_cast<size_t>(size_c * p.batch), seed + 2);
  Tensor ta = Tensor::from_vector(a, {p.batch * size_a}, gpu());
  Tensor tb = Tensor::from_vector(b, {p.batch * size_b}, gpu());
  Tensor tc = Tensor::from_vector(c0, {p.batch * size_c}, gpu());
  GemmArgs g;
  g.trans_a = p.trans_a, g.trans_b = p.trans_b;
  g.m = p.m, g.n = p.n, g.k = p.k, g.alpha = p.alpha, g.beta = p.beta;
  g.a = ta.data(), g.lda = cols_a, g.stride_a = size_a;
  g.b = tb.data(), g.ldb = cols_b, g.stride_b = size_b;
  g.c = tc.data(), g.ldc = p.n, g.stride_c = size_c;
  g.batch = p.batch;
  gpu().gemm(g);
  const std::vector<float> got = tc.to_vector();

  constexpr double u32 = 0x1p-24;
  Outcome out;
  for (int64_t q = 0; q < p.batch; ++q)
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) {
        double rounded = 0, plain = 0, magnitude = 0;
        for (int64_t r = 0; r < p.k; ++r) {
          const float x = a[static_cast<size_t>(q * size_a + (p.trans_a ? r * cols_a + i : i * cols_a + r))];
          const float y = b[static_cast<size_t>(q * size_b + (p.trans_b ? j * cols_b + r : r * cols_b + j))];
          rounded += static_cast<double>(rounding.round(x)) * rounding.round(y);
          plain += static_cast<double>(x) * y;
          magnitude += std::fabs(static_cast<double>(x) * y);
        }
        const size_t at = static_cast<size_t>(q * size_c + i * p.n + j);
        const double c = c0[at];
        const double s = std::fabs(p.alpha) * magnitude + std::fabs(p.beta * c);
        const double fp32_bound = static_cast<double>(p.k + 2) * u32 * s;
        const double rounded_bound = fp32_bound + rounding.roundoff * s;
        const double want_rounded = p.alpha * rounded + p.beta * c;
        const double want_plain = p.alpha * plain + p.beta * c;
        // Kept as NaN once one is met (std::max drops a NaN that comes after a number).
        const double vs_rounded = std::fabs(got[at] - want_rounded) / rounded_bound;
        const double vs_fp32 = std::fabs(got[at] - want_plain) / fp32_bound;
        if (!(vs_rounded <= out.worst_vs_rounded)) out.worst_vs_rounded = vs_rounded;
        if (!(vs_fp32 <= out.worst_vs_fp32)) out.worst_vs_fp32 = vs_fp32;
      }
  return out;
}

const Product kProducts[] = {
    {false, false, 64, 48, 256, 1, 1.f, 0.f},     // a linear layer's forward
    {false, true, 33, 65, 129, 1, 1.f, 0.f},      // x @ W^T, odd sizes
    {true, false, 40, 24, 512, 1, 1.f, 1.f},      // a weight gradient, accumulated into C
    {true, true, 17, 31, 96, 1, 0.5f, 0.25f},     // both transposed, alpha and beta
    {false, true, 32, 32, 64, 12, 0.125f, 0.f},   // batched q @ k^T, 12 heads
    {false, false, 32, 64, 32, 12, 1.f, 0.f},     // batched p @ v
};

// The products of kProducts in `p`, each against its references, and again in fp32.
void check_products(Precision p, Rounding rounding) {
  for (const Product& q : kProducts) {
    const std::string shape = std::to_string(q.batch) + " x (" + std::to_string(q.m) + " x " +
                              std::to_string(q.k) + ") @ (" + std::to_string(q.k) + " x " +
                              std::to_string(q.n) + ")" + (q.trans_a ? ", A^T" : "") +
                              (q.trans_b ? ", B^T" : "");
    CAPTURE(shape);
    Outcome reduced;
    {
      Mode mode(p);
      reduced = run_product(q, 7, rounding);
    }
    CHECK(reduced.worst_vs_rounded <= 1.0);
    // The mode took effect: not an fp32 product. cuBLAS's FAST_16BF/16F compute types
    // allow the down-conversion rather than promise it, and for shapes off the tensor
    // cores' multiples of 8 it may keep an fp32 kernel: checked on the aligned ones only.
    if (q.m % 8 == 0 && q.n % 8 == 0 && q.k % 8 == 0)
      CHECK(reduced.worst_vs_fp32 > 1.0);
    // Back in fp32, the same product is fp32's again.
    const Outcome fp32 = run_product(q, 7, rounding);
    CHECK(fp32.worst_vs_fp32 <= 1.0);
    MESSAGE(precision_name(p) << ": " << reduced.worst_vs_rounded << " of its bound, " << reduced.worst_vs_fp32
                              << " of fp32's; fp32: " << fp32.worst_vs_fp32 << " of fp32's");
  }
}

// Every op case of the harness in `p` within the 1e-2 of the CPU.
void check_op_cases(Precision p) {
  Mode mode(p);
  for (const harness::OpCase& c : harness::all_op_cases()) {
    CAPTURE(c.name);
    for (uint64_t seed : {1u, 2u}) {
      // The harness's own tolerance is fp32's (1e-5); in a reduced precision the figure is
      // the issue's. Its verdict, not `worst` alone, also fails a NaN and a shape mismatch.
      harness::OpCase reduced = c;
      reduced.forward_tol = reduced.grad_tol = 1e-2;
      const harness::Report r = harness::check_against_cpu(reduced, gpu(), seed);
      CHECK_MESSAGE(r.ok, r.detail);
      MESSAGE(c.name << " seed " << seed << ": vs cpu " << r.worst);
    }
  }
  gpu().synchronize();
}

}  // namespace

TEST_CASE("cuda bf16: gemm and batched gemm round their operands to bf16 and sum in fp32") {
  if (!has_bf16()) {
    MESSAGE("not checked (bf16 needs sm_80): " << gpu().product_name() << " has compute capability "
                        << gpu().capability_major() << "." << gpu().capability_minor());
    return;
  }
  check_products(Precision::bf16, kBf16);
}

TEST_CASE("cuda fp16: gemm and batched gemm round their operands to half and sum in fp32") {
  check_products(Precision::fp16, kFp16);
}

TEST_CASE("cuda bf16: every op case within 1e-2 of the CPU in bf16") {
  if (!has_bf16()) {
    MESSAGE("not checked: " << gpu().product_name() << " has no bf16 tensor cores (sm_80)");
    return;
  }
  check_op_cases(Precision::bf16);
}

TEST_CASE("cuda fp16: every op case within 1e-2 of the CPU in fp16") { check_op_cases(Precision::fp16); }

TEST_CASE("cuda bf16: below sm_80 bf16 is refused naming the GPU and its capability") {
  const std::string why = gpu().precision_refusal(Precision::bf16);
  if (has_bf16()) {
    CHECK(why.empty());
  } else {
    CHECK(why.find(gpu().product_name()) != std::string::npos);
    CHECK(why.find("compute capability " + std::to_string(gpu().capability_major()) + "." +
                   std::to_string(gpu().capability_minor())) != std::string::npos);
    CHECK_THROWS_AS(gpu().set_precision(Precision::bf16), Error);
    CHECK(gpu().precision() == Precision::fp32);
  }
  // fp16 and fp32 are taken on every GPU CUDA 13 builds for.
  CHECK(gpu().precision_refusal(Precision::fp16).empty());
  CHECK(gpu().precision_refusal(Precision::fp32).empty());
}
