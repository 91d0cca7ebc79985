#include "tests/harness/mlp_step_reference.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ht::reference {

namespace {

constexpr double u = kUnitRoundoff;

struct Activations {  // one layer's input and pre-activation, each with its bound
  std::vector<double> a, ea;  // (rows, in)
  std::vector<double> z, ez;  // (rows, out)
};

// z = a W^T + b, computed as matmul then add: the row's in products and the bias are
// in + 1 terms of one sum, the operand a carries its own error ea.
void linear_forward(const DenseLayer& l, int64_t rows, Activations& act) {
  act.z.assign(static_cast<size_t>(rows * l.out), 0);
  act.ez.assign(act.z.size(), 0);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t j = 0; j < l.out; ++j) {
      double z = l.bias[static_cast<size_t>(j)], carried = 0, magnitude = std::fabs(z);
      for (int64_t k = 0; k < l.in; ++k) {
        const double w = l.weight[static_cast<size_t>(j * l.in + k)];
        const auto i = static_cast<size_t>(n * l.in + k);
        z += w * act.a[i];
        carried += std::fabs(w) * act.ea[i];
        magnitude += std::fabs(w) * (std::fabs(act.a[i]) + act.ea[i]);
      }
      const auto o = static_cast<size_t>(n * l.out + j);
      act.z[o] = z;
      act.ez[o] = carried + gamma(static_cast<double>(l.in + 1)) * magnitude;
    }
}

}  // namespace

double gamma(double n) {
  if (n * u >= 1) throw std::invalid_argument("gamma: n u >= 1");
  return n * u / (1 - n * u);
}

MlpStep mlp_step(const std::vector<DenseLayer>& layers, const Batch& batch, double max_norm,
                 int extra_loss_adds) {
  const int64_t rows = batch.rows;
  if (layers.empty() || rows <= 0) throw std::invalid_argument("mlp_step: no layers or no rows");
  // Forward: the float32 inputs are exact; a ReLU is 1-Lipschitz and rounds nothing.
  std::vector<Activations> acts(layers.size());
  acts[0].a = batch.inputs;
  acts[0].ea.assign(batch.inputs.size(), 0);
  for (size_t l = 0; l < layers.size(); ++l) {
    linear_forward(layers[l], rows, acts[l]);
    if (l + 1 == layers.size()) break;
    acts[l + 1].a.resize(acts[l].z.size());
    for (size_t i = 0; i < acts[l].z.size(); ++i) acts[l + 1].a[i] = std::max(acts[l].z[i], 0.0);
    acts[l + 1].ea = acts[l].ez;
  }

  // Cross-entropy, as the CPU backend computes it: lse = max + log(sum exp(z - max)),
  // loss = lse - z_label; its gradient scale * exp(z - lse), minus scale at the label,
  // where scale = float32(1 / rows) stands for the exact 1 / rows.
  const DenseLayer& head = layers.back();
  const int64_t classes = head.out;
  const std::vector<double>& z = acts.back().z;
  const std::vector<double>& ez = acts.back().ez;
  const double scale = 1.0 / static_cast<double>(rows);
  std::vector<double> dz(z.size()), edz(z.size());
  MlpStep out;
  double loss_magnitude = 0, loss_carried = 0;
  for (int64_t n = 0; n < rows; ++n) {
    const double* zr = &z[static_cast<size_t>(n * classes)];
    const double* er = &ez[static_cast<size_t>(n * classes)];
    const int32_t y = batch.labels[static_cast<size_t>(n)];
    if (y < 0 || y >= classes)
      throw std::invalid_argument("mlp_step: label " + std::to_string(y) + " out of range");
    double m = zr[0], e_in = 0;
    for (int64_t j = 0; j < classes; ++j) {
      m = std::max(m, zr[j]);
      e_in = std::max(e_in, er[j]);  // lse is 1-Lipschitz in the largest input error
    }
    double s = 0, rel_terms = 0;
    for (int64_t j = 0; j < classes; ++j) {
      s += std::exp(zr[j] - m);
      // the subtraction (of operands off by up to e_in each), then exp
      rel_terms = std::max(rel_terms, std::expm1(u * (std::fabs(zr[j] - m) + 2 * e_in) + kLibmUlps * u));
    }
    const double lse = m + std::log(s);
    const double rel_s = rel_terms * (1 + gamma(static_cast<double>(classes))) + gamma(static_cast<double>(classes));
    const double e_lse = e_in - std::log1p(-rel_s) + kLibmUlps * u * std::fabs(std::log(s)) +
                         u * (std::fabs(lse) + e_in + rel_s);
    const double ce = lse - zr[y];
    const double e_ce = e_lse + er[y] + u * (std::fabs(ce) + e_lse + er[y]);
    out.loss_sum += ce;
    loss_carried += e_ce;
    loss_magnitude += std::fabs(ce) + e_ce;
    for (int64_t j = 0; j < classes; ++j) {
      const auto i = static_cast<size_t>(n * classes + j);
      const double p = std::exp(zr[j] - lse);
      const double arg = er[j] + e_lse + u * (std::fabs(zr[j] - lse) + er[j] + e_lse);
      const double ep = p * std::expm1(arg + kLibmUlps * u);
      // scale's own rounding (u), then the product's (u)
      double e = scale * ep + 2 * u * scale * (p + ep) * (1 + u);
      dz[i] = scale * p;
      if (j == y) {
        dz[i] -= scale;
        e += u * scale * (1 + u) + u * (std::fabs(dz[i]) + e);
      }
      edz[i] = e;
    }
  }
  out.loss_bound = loss_carried + gamma(static_cast<double>(rows + extra_loss_adds)) * loss_magnitude;

  // Backward, last layer first. Weight and bias gradients sum over every row of the
  // global batch: whatever tree the micro-batches and replicas make of that sum, it has
  // `rows` leaves.
  out.weight_grad.resize(layers.size());
  out.bias_grad.resize(layers.size());
  const double g_rows = gamma(static_cast<double>(rows));
  for (size_t l = layers.size(); l-- > 0;) {
    const DenseLayer& L = layers[l];
    const Activations& act = acts[l];
    Bounded& gw = out.weight_grad[l];
    Bounded& gb = out.bias_grad[l];
    gw.value.assign(static_cast<size_t>(L.out * L.in), 0);
    gw.bound.assign(gw.value.size(), 0);
    gb.value.assign(static_cast<size_t>(L.out), 0);
    gb.bound.assign(gb.value.size(), 0);
    for (int64_t j = 0; j < L.out; ++j) {
      double vb = 0, cb = 0, mb = 0;
      for (int64_t n = 0; n < rows; ++n) {
        const auto o = static_cast<size_t>(n * L.out + j);
        vb += dz[o];
        cb += edz[o];
        mb += std::fabs(dz[o]) + edz[o];
      }
      gb.value[static_cast<size_t>(j)] = vb;
      gb.bound[static_cast<size_t>(j)] = cb + g_rows * mb;
      for (int64_t k = 0; k < L.in; ++k) {
        double v = 0, c = 0, mag = 0;
        for (int64_t n = 0; n < rows; ++n) {
          const auto o = static_cast<size_t>(n * L.out + j);
          const auto i = static_cast<size_t>(n * L.in + k);
          const double a = std::fabs(act.a[i]), ea = act.ea[i];
          v += dz[o] * act.a[i];
          c += edz[o] * a + std::fabs(dz[o]) * ea + edz[o] * ea;
          mag += (std::fabs(dz[o]) + edz[o]) * (a + ea);
        }
        const auto w = static_cast<size_t>(j * L.in + k);
        gw.value[w] = v;
        gw.bound[w] = c + g_rows * mag;
      }
    }
    if (l == 0) break;
    // The input's gradient dz W, then the previous ReLU's mask (z > 0). Where that z is
    // within its error of 0 the float32 run may take either branch.
    const Activations& prev = acts[l - 1];
    std::vector<double> da(static_cast<size_t>(rows * L.in)), eda(da.size());
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t k = 0; k < L.in; ++k) {
        double v = 0, c = 0, mag = 0;
        for (int64_t j = 0; j < L.out; ++j) {
          const auto o = static_cast<size_t>(n * L.out + j);
          const double w = L.weight[static_cast<size_t>(j * L.in + k)];
          v += dz[o] * w;
          c += edz[o] * std::fabs(w);
          mag += (std::fabs(dz[o]) + edz[o]) * std::fabs(w);
        }
        const auto i = static_cast<size_t>(n * L.in + k);
        da[i] = v;
        eda[i] = c + gamma(static_cast<double>(L.out)) * mag;
      }
    dz.assign(da.size(), 0);
    edz.assign(da.size(), 0);
    for (size_t i = 0; i < da.size(); ++i) {
      dz[i] = prev.z[i] > 0 ? da[i] : 0;
      edz[i] = std::fabs(prev.z[i]) <= prev.ez[i] ? std::fabs(da[i]) + eda[i] : eda[i];
    }
  }

  // Clipping (optim/grad_clip.cpp): each tensor's sum of squares in float32, the tensors'
  // and the ranks' partial sums added (some through float32 casts and all-reduces), then
  // scale = max_norm / (sqrt(total) + 1e-6) in double, applied in float32 when below 1.
  double total = 0, e_total = 0, squares = 0;
  size_t largest = 0;
  auto add_squares = [&](const Bounded& g) {
    largest = std::max(largest, g.value.size());
    for (size_t i = 0; i < g.value.size(); ++i) {
      const double v = std::fabs(g.value[i]), e = g.bound[i];
      total += v * v;
      e_total += 2 * v * e + e * e;
      squares += (v + e) * (v + e);
    }
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    add_squares(out.weight_grad[l]);
    add_squares(out.bias_grad[l]);
  }
  // square (1), tensor sum (largest), 2 casts and 2 all-reduces of up to 4 partial sums
  e_total += gamma(static_cast<double>(largest + 1 + 2 + 6)) * squares;
  out.norm = std::sqrt(total);
  if (max_norm <= 0) return out;
  const double rel_total = e_total / total;
  if (!(rel_total < 0.5)) throw std::runtime_error("mlp_step: the gradient norm is lost in rounding");
  const double rel_norm = 1 - std::sqrt(1 - rel_total);  // sqrt halves it, at worst
  const double rel_scale = rel_norm / (1 - rel_norm) + 4e-16 + u;  // the division; its float cast
  const double exact_scale = max_norm / (out.norm + 1e-6);
  out.clip_scale = std::min(1.0, exact_scale);
  const double e_scale = out.clip_scale * rel_scale * (1 + rel_scale);
  auto clip = [&](Bounded& g) {
    for (size_t i = 0; i < g.value.size(); ++i) {
      const double v = std::fabs(g.value[i]), e = g.bound[i];
      g.value[i] *= out.clip_scale;
      g.bound[i] = out.clip_scale * e + e_scale * (v + e) + u * (out.clip_scale + e_scale) * (v + e);
    }
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    clip(out.weight_grad[l]);
    clip(out.bias_grad[l]);
  }
  return out;
}

// Each moment is two products and a sum: three roundings (gamma_3) for m; v squares the
// gradient as well (gamma_4). The gradient's own error is carried by its coefficient.
Bounded adamw_exp_avg(const std::vector<double>& before, const Bounded& grad, double beta1) {
  Bounded m;
  for (size_t i = 0; i < before.size(); ++i) {
    const double g = grad.value[i], e = grad.bound[i];
    m.value.push_back(beta1 * before[i] + (1 - beta1) * g);
    m.bound.push_back((1 - beta1) * e + gamma(3) * (beta1 * std::fabs(before[i]) + (1 - beta1) * (std::fabs(g) + e)));
  }
  return m;
}

Bounded adamw_exp_avg_sq(const std::vector<double>& before, const Bounded& grad, double beta2) {
  Bounded v;
  for (size_t i = 0; i < before.size(); ++i) {
    const double g = std::fabs(grad.value[i]), e = grad.bound[i];
    v.value.push_back(beta2 * before[i] + (1 - beta2) * g * g);
    v.bound.push_back((1 - beta2) * (2 * g * e + e * e) +
                      gamma(4) * (beta2 * std::fabs(before[i]) + (1 - beta2) * (g + e) * (g + e)));
  }
  return v;
}

// Roundings of the update term, counted along the CPU kernel's formula: the bias
// corrections' casts and lr / bc1 (2), 1 / sqrt(bc2) (3), sqrt(v) x that (2), + eps (1),
// step x m (1), / denominator (1): gamma_10, taken as gamma_12. The decay factor and the
// product with it (3) and the final subtraction (1).
Bounded adamw_parameters(const std::vector<double>& before, const std::vector<double>& exp_avg,
                         const std::vector<double>& exp_avg_sq, const AdamWHyper& h) {
  const double bc1 = 1 - std::pow(h.beta1, static_cast<double>(h.updates));
  const double bc2 = 1 - std::pow(h.beta2, static_cast<double>(h.updates));
  const double decay = 1 - h.lr * h.weight_decay;
  Bounded p;
  for (size_t i = 0; i < before.size(); ++i) {
    const double update = h.lr / bc1 * exp_avg[i] / (std::sqrt(exp_avg_sq[i]) / std::sqrt(bc2) + h.eps);
    const double kept = before[i] * decay;
    p.value.push_back(kept - update);
    p.bound.push_back(gamma(12) * std::fabs(update) + gamma(4) * std::fabs(kept) + u * std::fabs(kept - update));
  }
  return p;
}

Worst worst_ratio(const std::vector<double>& got, const Bounded& want) {
  if (got.size() != want.value.size())
    throw std::invalid_argument("worst_ratio: " + std::to_string(got.size()) + " values against " +
                                std::to_string(want.value.size()));
  Worst w;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - want.value[i]);
    const double r = d == 0 ? 0 : want.bound[i] > 0 ? d / want.bound[i] : INFINITY;
    if (i == 0 || r > w.ratio) w = {r, i, got[i], want.value[i], want.bound[i]};
  }
  return w;
}

}  // namespace ht::reference
