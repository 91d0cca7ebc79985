#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "autograd/graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace ht::optim {

namespace detail {
void check_range(const char* what, const char* name, float value, float lo, float hi,
                 bool hi_open) {
  // Written so that NaN fails every comparison and so is rejected too.
  if (value >= lo && (hi_open ? value < hi : value <= hi)) return;
  if (std::isinf(hi))
    fail(what, ": ", name, " ", value, " is out of range; expected a finite ", name, " >= ", lo);
  fail(what, ": ", name, " ", value, " is out of range; expected ", lo, " <= ", name,
       hi_open ? " < " : " <= ", hi);
}
}  // namespace detail

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();

// Counters travel as int32 tensors, the integer dtype checkpoints already carry; they
// live in host memory, where the checkpoint writer and load_state read them.
Tensor counter_tensor(const char* what, const std::string& name, int64_t value) {
  HT_CHECK(value <= std::numeric_limits<int32_t>::max(), what, ": state '", name, "' = ", value,
           " does not fit the int32 checkpoint counter; expected at most 2^31 - 1");
  return Tensor::from_ints({static_cast<int32_t>(value)}, {1}, cpu_backend());
}
}  // namespace

Optimizer::Optimizer(std::vector<nn::NamedTensor> params, float lr, const char* what,
                     std::vector<std::string> slots)
    : params_(std::move(params)), lr_(lr), what_(what), slot_names_(std::move(slots)) {
  HT_CHECK(!params_.empty(), what_, ": got an empty parameter list; expected at least one");
  detail::check_range(what_, "lr", lr, 0.f, kInf, true);
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, p] : params_) {
    HT_CHECK(p.defined(), what_, ": parameter '", name, "' is an undefined tensor");
    HT_CHECK(p.dtype() == DType::f32, what_, ": parameter '", name, "' is ",
             dtype_name(p.dtype()), "; expected float32");
    // The fused update walks the parameter's buffer element by element.
    HT_CHECK(p.is_contiguous(), what_, ": parameter '", name, "' of shape ",
             to_string(p.shape()), " is a strided view; expected a dense tensor");
    HT_CHECK(seen.insert(p.impl()).second, what_, ": parameter '", name,
             "' is the same tensor as an earlier entry; expected each parameter once "
             "(it would be updated twice per step)");
  }
  slots_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t k = 0; k < slot_names_.size(); ++k)
      slots_[i].push_back(Tensor::zeros(params_[i].second.shape(), params_[i].second.backend()));
  updates_.assign(params_.size(), 0);

  // State is matched by name, so every name must be unambiguous (this also catches
  // duplicate parameter names, and ones like "w" beside "w.exp_avg").
  std::unordered_set<std::string> names;
  for (const auto& [name, t] : state())
    HT_CHECK(names.insert(name).second, what_, ": state name '", name,
             "' arises twice from the parameter names; expected unique parameter names");
}

void Optimizer::set_lr(float lr) {
  detail::check_range(what_, "lr", lr, 0.f, kInf, true);
  lr_ = lr;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  // Check every gradient before touching any parameter, so a bad one leaves the
  // model as it was rather than half-stepped.
  std::vector<Tensor> grads(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    HT_CHECK(g.dtype() == DType::f32, what_, ": the gradient of '", name, "' is ",
             dtype_name(g.dtype()), "; expected float32");
    HT_CHECK(&g.backend() == &p.backend(), what_, ": the gradient of '", name, "' lives on ",
             g.backend().name(), " but the parameter on ", p.backend().name(),
             "; expected both on one device");
    grads[i] = contiguous(g);
  }
  // Groups in parameter order, one per backend and update count (usually one group).
  std::vector<std::pair<std::pair<const Backend*, int64_t>, std::vector<size_t>>> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads[i].defined()) continue;
    const std::pair<const Backend*, int64_t> key{&params_[i].second.backend(), ++updates_[i]};
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
    if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
    it->second.push_back(i);
  }
  for (const auto& [key, indices] : groups) update_group(indices, grads, key.second);
  ++step_count_;
}

void Optimizer::update_group(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                             int64_t updates) {
  for (size_t i : indices) update(i, params_[i].second, grads[i], updates);
}

void Optimizer::zero_grad() {
  for (const auto& [name, p] : params_) p.zero_grad();
}

std::vector<nn::NamedTensor> Optimizer::state() const {
  std::vector<nn::NamedTensor> out;
  out.reserve(params_.size() * (slot_names_.size() + 1) + 1);
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].first;
    for (size_t k = 0; k < slot_names_.size(); ++k)
      out.emplace_back(name + "." + slot_names_[k], slots_[i][k]);
    out.emplace_back(name + ".step", counter_tensor(what_, name + ".step", updates_[i]));
  }
  out.emplace_back("step", counter_tensor(what_, "step", step_count_));
  return out;
}

void Optimizer::load_state(const std::vector<nn::NamedTensor>& state) {
  std::unordered_map<std::string, const Tensor*> given;
  StateSource source;
  for (const auto& [name, t] : state) {
    HT_CHECK(t.defined(), what_, ": load_state: '", name, "' is an undefined tensor");
    given.emplace(name, &t);
    source.names.push_back(name);
  }
  source.shape = [&](const std::string& name) { return std::make_pair(given.at(name)->shape(), given.at(name)->dtype()); };
  source.read = [&](const std::string& name) { return *given.at(name); };
  load_state(source);
}

void Optimizer::load_state(const StateSource& source) {
  std::unordered_set<std::string> given;
  for (const std::string& name : source.names)
    HT_CHECK(given.insert(name).second, what_, ": load_state: '", name,
             "' appears twice; expected each state tensor once");
  std::vector<nn::NamedTensor> mine = this->state();
  std::unordered_set<std::string> expected;
  for (const auto& [name, m] : mine) {
    expected.insert(name);
    HT_CHECK(given.count(name), what_, ": load_state: no tensor named '", name,
             "'; expected every name state() gives (was the state saved for other parameters "
             "or another optimiser?)");
    const auto [shape, dtype] = source.shape(name);
    HT_CHECK(shape == m.shape(), what_, ": load_state: '", name, "' has shape ", to_string(shape), "; expected ",
             to_string(m.shape()));
    HT_CHECK(dtype == m.dtype(), what_, ": load_state: '", name, "' is ", dtype_name(dtype), "; expected ",
             dtype_name(m.dtype()));
  }
  for (const std::string& name : source.names)
    HT_CHECK(expected.count(name), what_, ": load_state: unexpected tensor '", name,
             "'; this optimiser's state has no such entry");

  auto read_counter = [&](const std::string& name) {
    int32_t v = source.read(name).to_ints()[0];
    HT_CHECK(v >= 0, what_, ": load_state: counter '", name, "' is ", v,
             "; expected a count >= 0");
    return static_cast<int64_t>(v);
  };
  std::vector<int64_t> updates(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) updates[i] = read_counter(params_[i].first + ".step");
  int64_t steps = read_counter("step");
  for (size_t i = 0; i < params_.size(); ++i)
    if (updates[i] > steps)
      fail_as<StateValueError>(what_, ": load_state: counter '", params_[i].first, ".step' is ", updates[i],
                               ", above the optimiser's step count ", steps,
                               "; expected at most one update of a parameter a step");

  // The values a slot must keep, before anything changes (a bad one leaves the state as
  // it was): read here and again to copy, so that one tensor is held at a time, as a
  // resume reads the state (a model's whole exp_avg_sq is its size again).
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t k = 0; k < slot_names_.size(); ++k) {
      if (!slot_nonnegative(k)) continue;
      const std::string name = params_[i].first + "." + slot_names_[k];
      const std::vector<float> host = source.read(name).to_vector();
      for (size_t j = 0; j < host.size(); ++j)
        if (!(host[j] >= 0))
          fail_as<StateValueError>(what_, ": load_state: '", name, "' holds ", host[j], " at element ", j,
                                   "; expected values >= 0");
    }

  // All checked: now copy, one tensor at a time. Going through the host lets the source
  // live on any backend.
  for (size_t i = 0; i < params_.size(); ++i)
    for (size_t k = 0; k < slot_names_.size(); ++k) {
      const Tensor& dst = slots_[i][k];
      std::vector<float> host = source.read(params_[i].first + "." + slot_names_[k]).to_vector();
      dst.backend().copy_from_host(dst.data(), host.data(), host.size() * sizeof(float));
    }
  updates_ = std::move(updates);
  step_count_ = steps;
}

}  // namespace ht::optim
