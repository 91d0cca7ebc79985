// Vectorisable float math for the CPU kernels. glibc's tanhf is a scalar call (and
// goes through expm1f); inside `omp simd` loops this inlines to plain arithmetic.
#pragma once

#include <cstddef>

#include "backend/allocator.h"
#include "core/host_device.h"

namespace ht::cpu {

using ht::tanh_approx;  // core/host_device.h: the CUDA kernels compute the same

// Scratch floats from a backend's allocator, counted like a tensor's, for the length of a
// primitive that composes others (conv2d's columns, attention's scores).
class Scratch {
 public:
  Scratch(Allocator& a, size_t floats, const char* what)
      : a_(a), bytes_(floats * sizeof(float)), p_(static_cast<float*>(a.allocate(bytes_, what))) {}
  ~Scratch() { a_.deallocate(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return p_; }

 private:
  Allocator& a_;
  size_t bytes_;
  float* p_;
};

}  // namespace ht::cpu
