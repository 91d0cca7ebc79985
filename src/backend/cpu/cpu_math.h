// Vectorisable float math for the CPU kernels. glibc's tanhf is a scalar call (and
// goes through expm1f); inside `omp simd` loops this inlines to plain arithmetic.
#pragma once

#include "core/host_device.h"

namespace ht::cpu {

using ht::tanh_approx;  // core/host_device.h: the CUDA kernels compute the same

}  // namespace ht::cpu
