// Modules own parameters. Names are dotted paths ("layers.0.weight") so that
// checkpoints and optimiser state can be matched by name.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ht::nn {

using NamedTensor = std::pair<std::string, Tensor>;

class Module {
 public:
  virtual ~Module() = default;

  // Parameters of this module and its children, in a stable order.
  virtual std::vector<NamedTensor> named_parameters() const = 0;

  std::vector<Tensor> parameters() const;
  int64_t param_count() const;
  void zero_grad() const;

  virtual void set_training(bool on) { training_ = on; }
  bool training() const { return training_; }

 protected:
  // Prefixes each child's names with `prefix` + "."
  static void append(std::vector<NamedTensor>& out, const std::string& prefix,
                     const std::vector<NamedTensor>& child);

 private:
  bool training_ = true;
};

}  // namespace ht::nn
