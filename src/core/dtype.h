#pragma once

#include <cstddef>

namespace ht {

// float32 carries values and gradients; int32 carries labels, token ids and indices.
enum class DType { f32, i32 };

constexpr size_t dtype_size(DType) { return 4; }
constexpr const char* dtype_name(DType d) { return d == DType::f32 ? "float32" : "int32"; }

}  // namespace ht
