// A float64 reference of one training step of a ReLU MLP, with a bound on every value.
//
// The model is Linear -> ReLU -> ... -> Linear; the loss is the summed cross-entropy of the
// batch, and the gradient is that of the sample mean (1/rows x the sum), clipped by its
// global L2 norm; AdamW then updates the moments and the parameters. Each value comes
// with `bound`: how far a float32 evaluation of the same formulas can be from it, whatever
// the order of its sums (BLAS blocking, FMA, the batch split into micro-batches and
// replicas whose partial sums are added in float32 in any order). The bounds follow the
// standard forward error analysis (Higham, "Accuracy and Stability of Numerical
// Algorithms", ch. 3): a sum of n products is within gamma_n = n u / (1 - n u) of the
// sum of their magnitudes, u = 2^-24; errors already in the operands are carried through
// by the magnitudes of what multiplies them, and a ReLU whose input is within its error of
// 0 may pass its gradient or not. exp and log are taken as accurate to kLibmUlps ulps.
//
// It uses no hetrain code, so that the code under test cannot agree with itself: plain
// loops over std::vector<double>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ht::reference {

constexpr double kUnitRoundoff = 1.0 / (1 << 24);  // float32, round to nearest
constexpr double kLibmUlps = 4;                     // expf, logf: glibc documents < 1 ulp

double gamma(double n);  // n u / (1 - n u)

// value[i] in float64; |float32 result[i] - value[i]| <= bound[i].
struct Bounded {
  std::vector<double> value, bound;
};

struct DenseLayer {
  int64_t in = 0, out = 0;
  std::vector<double> weight;  // (out, in), row-major: the float32 parameters as they are
  std::vector<double> bias;    // (out)
};

struct Batch {
  int64_t rows = 0;
  std::vector<double> inputs;    // (rows, in): the float32 inputs as they are
  std::vector<int32_t> labels;   // (rows), each in [0, classes)
};

struct MlpStep {
  double loss_sum = 0, loss_bound = 0;  // summed cross-entropy over the rows
  double norm = 0;                      // the unclipped gradient's global L2 norm
  double clip_scale = 1;                // min(1, max_norm / (norm + 1e-6)), as clip_grad_norm
  std::vector<Bounded> weight_grad, bias_grad;  // per layer, clipped
};

// `max_norm` 0: no clipping. `extra_loss_adds`: float32 additions of partial losses beyond
// the rows' own sum (micro-batch and rank totals), counted into loss_bound.
MlpStep mlp_step(const std::vector<DenseLayer>& layers, const Batch& batch, double max_norm,
                 int extra_loss_adds);

// AdamW (optim/adamw.h) in float64. The moments after the step from the float32 moments
// before it (exact inputs) and the bounded gradient:
//   m = beta1 m + (1 - beta1) g,  v = beta2 v + (1 - beta2) g^2.
Bounded adamw_exp_avg(const std::vector<double>& before, const Bounded& grad, double beta1);
Bounded adamw_exp_avg_sq(const std::vector<double>& before, const Bounded& grad, double beta2);

struct AdamWHyper {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  int64_t updates = 0;  // t, counting this update
};

// The parameters after the update from the parameters before it and the float32 moments
// after it (exact inputs): the bound covers the fused update's own rounding,
//   p (1 - lr wd) - lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
Bounded adamw_parameters(const std::vector<double>& before, const std::vector<double>& exp_avg,
                         const std::vector<double>& exp_avg_sq, const AdamWHyper& h);

// The largest |got[i] - want.value[i]| / want.bound[i] (0 where they are equal), and where.
struct Worst {
  double ratio = 0;
  size_t index = 0;
  double got = 0, want = 0, bound = 0;
};
Worst worst_ratio(const std::vector<double>& got, const Bounded& want);

}  // namespace ht::reference
