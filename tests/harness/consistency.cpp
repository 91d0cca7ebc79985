#include "tests/harness/consistency.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autograd/graph.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace ht::harness {

namespace {

struct Inputs {
  std::vector<Values> values;  // exactly what the tensors hold, widened to double
};

Inputs make_inputs(const OpCase& c, uint64_t seed) {
  Rng rng(seed * 7919 + std::hash<std::string>{}(c.name));
  Inputs in;
  for (const InputSpec& s : c.inputs) {
    Values v(numel(s.shape));
    for (double& x : v) {
      switch (s.kind) {
        case InputSpec::Kind::real: {
          float f = rng.uniform(static_cast<float>(s.lo), static_cast<float>(s.hi));
          if (std::fabs(f) < s.min_abs) f = f < 0 ? -static_cast<float>(s.min_abs) - f
                                                  : static_cast<float>(s.min_abs) + f;
          x = f;
          break;
        }
        case InputSpec::Kind::mask: x = rng.uniform() < 0.5f ? 0.0 : 1.0; break;
        case InputSpec::Kind::index: x = static_cast<double>(rng.below(s.bound)); break;
      }
    }
    in.values.push_back(std::move(v));
  }
  return in;
}

std::vector<Tensor> to_tensors(const OpCase& c, const Inputs& in, Backend& be, bool grad) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    if (s.kind == InputSpec::Kind::index) {
      std::vector<int32_t> v(in.values[i].begin(), in.values[i].end());
      out.push_back(Tensor::from_ints(v, s.shape, be));
    } else {
      std::vector<float> v(in.values[i].begin(), in.values[i].end());
      Tensor t = Tensor::from_vector(v, s.shape, be);
      if (grad && s.differentiable()) t.set_requires_grad();
      out.push_back(t);
    }
  }
  return out;
}

Values widen(const std::vector<float>& v) { return Values(v.begin(), v.end()); }

Values cotangent(size_t n, uint64_t seed) {
  Rng rng(seed + 17);
  Values w(n);
  for (double& x : w) x = rng.uniform(-1.f, 1.f);
  return w;
}

double dot(const Values& a, const Values& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Forward plus the gradients of sum(out * w) with respect to every differentiable input.
struct Run {
  Shape out_shape;
  Values out;
  std::vector<Values> grads;  // empty for non-differentiable inputs
};

Run run_with_grads(const OpCase& c, const Inputs& in, Backend& be, uint64_t seed) {
  std::vector<Tensor> xs = to_tensors(c, in, be, true);
  Tensor y = c.run(xs);
  Run r;
  r.out_shape = y.shape();
  r.out = widen(y.to_vector());
  Values w = cotangent(r.out.size(), seed);
  std::vector<float> wf(w.begin(), w.end());
  if (y.requires_grad()) y.backward(Tensor::from_vector(wf, y.shape(), be));
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!c.inputs[i].differentiable()) {
      r.grads.emplace_back();
      continue;
    }
    Tensor g = xs[i].grad();
    r.grads.push_back(g.defined() ? widen(g.to_vector()) : Values(xs[i].numel(), 0.0));
  }
  return r;
}

std::string describe(const OpCase& c, const std::string& what, double err, double tol) {
  std::ostringstream s;
  s << c.name << ": " << what << " normalised error " << err << " exceeds " << tol;
  return s.str();
}

void note(Report& r, double err, double tol, const OpCase& c, const std::string& what) {
  // A NaN is kept as the worst (std::max would drop one that comes after a number), so a
  // caller that reads only `worst` sees it.
  if (std::isnan(err) || err > r.worst) r.worst = err;
  if (!(err <= tol)) {  // NaN fails too
    r.ok = false;
    if (!r.detail.empty()) r.detail += "; ";
    r.detail += describe(c, what, err, tol);
  }
}

}  // namespace

double normalized_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double scale = 0.01, err = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::fabs(got[i] - want[i]);
    if (std::isnan(e)) return NAN;
    err = std::max(err, e);
  }
  return err / scale;
}

Report check_forward(const OpCase& c, Backend& be, uint64_t seed) {
  Inputs in = make_inputs(c, seed);
  NoGradGuard no_grad;
  Tensor y = c.run(to_tensors(c, in, be, false));
  Report r;
  note(r, normalized_error(widen(y.to_vector()), c.reference(in.values)), c.forward_tol, c,
       "forward vs reference");
  return r;
}

Report check_gradients(const OpCase& c, Backend& be, uint64_t seed) {
  Inputs in = make_inputs(c, seed);
  Run run = run_with_grads(c, in, be, seed);
  Values w = cotangent(run.out.size(), seed);
  Report r;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].differentiable()) continue;
    Values fd(in.values[i].size());
    std::vector<Values> probe = in.values;
    for (size_t j = 0; j < fd.size(); ++j) {
      double x = in.values[i][j], h = 1e-5 * std::max(1.0, std::fabs(x));
      probe[i][j] = x + h;
      double up = dot(c.reference(probe), w);
      probe[i][j] = x - h;
      double down = dot(c.reference(probe), w);
      probe[i][j] = x;
      fd[j] = (up - down) / (2 * h);
    }
    note(r, normalized_error(run.grads[i], fd), c.grad_tol, c,
         "gradient of input " + std::to_string(i) + " vs finite differences");
  }
  return r;
}

Report check_against_cpu(const OpCase& c, Backend& be, uint64_t seed) {
  Inputs in = make_inputs(c, seed);
  Run want = run_with_grads(c, in, cpu_backend(), seed);
  Run got = run_with_grads(c, in, be, seed);
  Report r;
  if (got.out_shape != want.out_shape) {
    r.ok = false;
    r.worst = INFINITY;
    r.detail = c.name + ": output shape " + to_string(got.out_shape) + " on " + be.name() +
               " vs " + to_string(want.out_shape) + " on cpu";
    return r;
  }
  note(r, normalized_error(got.out, want.out), c.forward_tol, c, "forward vs cpu");
  for (size_t i = 0; i < got.grads.size(); ++i)
    if (c.inputs[i].differentiable())
      note(r, normalized_error(got.grads[i], want.grads[i]), c.grad_tol, c,
           "gradient of input " + std::to_string(i) + " vs cpu");
  return r;
}

}  // namespace ht::harness
