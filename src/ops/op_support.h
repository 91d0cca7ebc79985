// Checks shared by the op implementations (internal to src/ops).
#pragma once

#include "autograd/graph.h"
#include "core/error.h"
#include "ops/ops.h"

namespace ht::detail {

inline void check_f32(const Tensor& t, const char* op, const char* arg) {
  HT_CHECK(t.defined(), op, ": ", arg, " is an undefined tensor");
  HT_CHECK(t.dtype() == DType::f32, op, ": ", arg, " of shape ", to_string(t.shape()), " is ",
           dtype_name(t.dtype()), "; expected float32");
}

inline void check_i32(const Tensor& t, const char* op, const char* arg) {
  HT_CHECK(t.defined(), op, ": ", arg, " is an undefined tensor");
  HT_CHECK(t.dtype() == DType::i32, op, ": ", arg, " of shape ", to_string(t.shape()), " is ",
           dtype_name(t.dtype()), "; expected int32");
}

inline void check_same_backend(const Tensor& a, const Tensor& b, const char* op) {
  HT_CHECK(&a.backend() == &b.backend(), op, ": operands live on ", a.backend().name(), " and ",
           b.backend().name(), "; expected both on one device");
}

inline void check_rank(const Tensor& t, int64_t rank, const char* op, const char* arg) {
  HT_CHECK(t.dim() == rank, op, ": ", arg, " has shape ", to_string(t.shape()), "; expected ",
           rank, " dimensions");
}

}  // namespace ht::detail
