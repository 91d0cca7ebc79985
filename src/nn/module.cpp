#include "nn/module.h"

namespace ht::nn {

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::param_count() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() const {
  for (auto& [name, t] : named_parameters()) t.zero_grad();
}

void Module::append(std::vector<NamedTensor>& out, const std::string& prefix,
                    const std::vector<NamedTensor>& child) {
  for (auto& [name, t] : child) out.emplace_back(prefix + "." + name, t);
}

}  // namespace ht::nn
