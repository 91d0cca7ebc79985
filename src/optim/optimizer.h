// Optimisers update named, dense float32 parameters in place from their gradients.
// The base class owns what every optimiser shares: the parameter list, the learning
// rate, step counting, per-parameter state buffers and their checkpoint form; a
// subclass names its state slots and applies one parameter's update.
//
// Checkpoint form (state() / load_state()):
//   "<param>.<slot>"  float32, the parameter's shape  (e.g. "fc.weight.exp_avg")
//   "<param>.step"    int32 (1,): updates applied to that parameter so far
//   "step"            int32 (1,): step() calls so far (step_count())
// Counting updates per parameter, as PyTorch does, keeps bias correction and the
// momentum start exact for parameters that had no gradient on some steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/module.h"

namespace ht::optim {

// A state that load_state refuses for its values, not its form: a slot that must not be
// negative and is, a parameter updated more often than the optimiser stepped. Apart from
// a mismatch of form (another optimiser's state), which callers report as such.
struct StateValueError : Error {
  using Error::Error;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient; the others are left as they are.
  void step();
  // Drops every parameter's gradient (the next backward starts from nothing).
  void zero_grad();

  float lr() const { return lr_; }
  void set_lr(float lr);  // for schedules; checked like the constructor's
  int64_t step_count() const { return step_count_; }
  const std::vector<nn::NamedTensor>& params() const { return params_; }

  // The live state buffers (not copies) and freshly made step counters.
  std::vector<nn::NamedTensor> state() const;
  // Copies `state` into this optimiser's buffers, from any backend. The names and
  // shapes must match state() exactly; everything is checked before anything changes.
  // Values it refuses (slot_nonnegative, a parameter's count above the step count) raise
  // StateValueError.
  void load_state(const std::vector<nn::NamedTensor>& state);
  // The same from a source that reads each tensor when asked, so that one is held at a
  // time (a resume reads the state from the checkpoint file): `shape` says a tensor's
  // shape and dtype without reading it, so everything is checked before anything changes.
  struct StateSource {
    std::vector<std::string> names;  // every tensor it holds
    std::function<std::pair<Shape, DType>(const std::string&)> shape;
    std::function<Tensor(const std::string&)> read;
  };
  void load_state(const StateSource& source);

 protected:
  // `what` names the optimiser in errors; `slots` names its per-parameter buffers,
  // which start as zeros of the parameter's shape on the parameter's backend.
  Optimizer(std::vector<nn::NamedTensor> params, float lr, const char* what,
            std::vector<std::string> slots);

  // Whether slot k (of the slots given to the constructor) holds values that are never
  // negative, which load_state checks (AdamW's exp_avg_sq: a square's running mean; a
  // negative one took the square root of it to NaN on the first update).
  virtual bool slot_nonnegative(size_t /*k*/) const { return false; }
  // Applies one update to params()[index]; `grad` is dense and on the parameter's
  // backend, and `updates` counts this one (1 on the first update of that parameter).
  virtual void update(size_t index, const Tensor& param, const Tensor& grad,
                      int64_t updates) = 0;
  // Applies the update to params()[i] with grads[i] for every i in `indices`: parameters
  // on one backend with the same update count, so one set of arguments serves them all.
  // This default calls update() per parameter; an optimiser overrides it with the
  // backend's multi-tensor update (one launch for all on a GPU).
  virtual void update_group(const std::vector<size_t>& indices, const std::vector<Tensor>& grads,
                            int64_t updates);

  // slot(index, k) is the k-th buffer (in constructor order) of params()[index].
  const Tensor& slot(size_t index, size_t k) const { return slots_[index][k]; }
  const char* what() const { return what_; }

 private:
  std::vector<nn::NamedTensor> params_;
  float lr_;
  const char* what_;
  std::vector<std::string> slot_names_;
  std::vector<std::vector<Tensor>> slots_;  // [param][slot]
  std::vector<int64_t> updates_;            // per parameter
  int64_t step_count_ = 0;
};

namespace detail {
// Hyperparameter check shared by the optimisers: `value` must lie in [lo, hi), or
// [lo, hi] when !hi_open; an infinite `hi` means "finite and >= lo". The error reads
// "<what>: <name> <value> is out of range; expected <lo> <= <name> < <hi>".
void check_range(const char* what, const char* name, float value, float lo, float hi,
                 bool hi_open);
}  // namespace detail

}  // namespace ht::optim
