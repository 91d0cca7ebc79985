// Bad input raises an error naming the op, the shapes or values, and what was expected.
#include <doctest/doctest.h>

#include "core/error.h"
#include "ops/ops.h"
#include "runtime/trainer.h"

using namespace ht;

namespace {
Tensor f32(Shape s) { return Tensor::zeros(s, cpu_backend()); }
}  // namespace

TEST_CASE("errors: shape mismatches name the op and both shapes") {
  CHECK_THROWS_WITH_AS(matmul(f32({2, 3}), f32({4, 5})),
                       doctest::Contains("matmul: inner dimensions differ: [2, 3] @ [4, 5]"), Error);
  CHECK_THROWS_WITH_AS(matmul(f32({2, 2, 3}), f32({3, 3, 4})),
                       doctest::Contains("batch dimensions differ"), Error);
  CHECK_THROWS_WITH_AS(add(f32({2, 3}), f32({4})),
                       doctest::Contains("add: shapes [2, 3] and [4] do not broadcast"), Error);
  CHECK_THROWS_WITH_AS(reshape(f32({2, 3}), {4, 2}),
                       doctest::Contains("reshape: shape [2, 3] (6 elements) cannot become [4, 2]"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(f32({1, 3, 5, 5}), f32({4, 2, 3, 3}), Tensor()),
                       doctest::Contains("expects 2 input channels"), Error);
  CHECK_THROWS_WITH_AS(layernorm(f32({2, 4}), f32({3}), f32({3})),
                       doctest::Contains("expected both of shape [4]"), Error);
  CHECK_THROWS_WITH_AS(slice(f32({3, 4}), 1, 2, 9), doctest::Contains("slice: range [2, 9)"), Error);
  CHECK_THROWS_WITH_AS(sum(f32({3, 4}), {2}), doctest::Contains("axis 2 is out of range"), Error);
  CHECK_THROWS_WITH_AS(causal_attention(f32({1, 2, 4, 3}), f32({1, 2, 4, 3}), f32({1, 2, 3, 3})),
                       doctest::Contains("expected three equal shapes"), Error);
  CHECK_THROWS_WITH_AS(maxpool2d(f32({1, 1, 1, 1}), 2, 2), doctest::Contains("does not fit"), Error);
}

TEST_CASE("errors: wrong dtypes name the argument and the expected dtype") {
  Tensor ids = Tensor::from_ints({0, 1}, {2}, cpu_backend());
  CHECK_THROWS_WITH_AS(matmul(ids, f32({2, 2})),
                       doctest::Contains("matmul: a of shape [2] is int32; expected float32"), Error);
  CHECK_THROWS_WITH_AS(embedding(f32({4, 3}), f32({2})),
                       doctest::Contains("embedding: ids of shape [2] is float32; expected int32"),
                       Error);
  CHECK_THROWS_WITH_AS(cross_entropy(f32({2, 3}), f32({2})), doctest::Contains("expected int32"),
                       Error);
  CHECK_THROWS_WITH_AS(ids.set_requires_grad(), doctest::Contains("cannot have a gradient"), Error);
}

TEST_CASE("errors: out-of-range indices name the value, its position and the range") {
  CHECK_THROWS_WITH_AS(embedding(f32({4, 3}), Tensor::from_ints({1, 4}, {2}, cpu_backend())),
                       doctest::Contains("embedding: id 4 at position 1 is out of range; expected 0 <= id < 4"),
                       Error);
  CHECK_THROWS_WITH_AS(embedding(f32({4, 3}), Tensor::from_ints({-1}, {1}, cpu_backend())),
                       doctest::Contains("id -1"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(f32({2, 3}), Tensor::from_ints({0, 3}, {2}, cpu_backend())),
                       doctest::Contains("cross_entropy: label 3 at row 1 is out of range; expected 0 <= label < 3"),
                       Error);
  CHECK_THROWS_WITH_AS(cross_entropy(f32({2, 3}), Tensor::from_ints({0, 1, 2}, {3}, cpu_backend())),
                       doctest::Contains("expected labels of shape [2]"), Error);
  CHECK_THROWS_WITH_AS(dropout(f32({2}), 1.0f, 1, 0), doctest::Contains("expected 0 <= p < 1"), Error);
}

TEST_CASE("errors: a memory cap turns an oversized activation into OutOfMemory, not a crash") {
  Allocator& a = cpu_backend().allocator();
  a.set_cap(a.live_bytes() + (1 << 20));
  Tensor x = Tensor::zeros({64, 64}, cpu_backend());
  CHECK_THROWS_AS(matmul(reshape(Tensor::zeros({512, 64}, cpu_backend()), {512, 64}), Tensor::zeros({64, 1024}, cpu_backend())),
                  OutOfMemory);
  CHECK(matmul(x, x).shape() == Shape{64, 64});  // the engine still works afterwards
  a.set_cap(0);
}

TEST_CASE("errors: one process's host memory is capped below what the machine has free, an emulated cap kept") {
  Allocator& a = cpu_backend().allocator();
  const size_t before = a.cap();
  a.set_cap(0);
  CHECK(runtime::cap_host_memory(a, 0) == 0);  // unknown: no cap
  CHECK(a.cap() == 0);
  const size_t available = size_t{10} << 30;
  const size_t cap = runtime::cap_host_memory(a, available);
  CHECK(cap == static_cast<size_t>(static_cast<double>(available) * (1 - runtime::kHostReserve)));
  CHECK(a.cap() == cap);
  CHECK(runtime::cap_host_memory(a, available) == 0);  // capped already
  a.set_cap(123 << 20);  // an emulated device's (emulate.ranks[].memory_cap_mb)
  CHECK(runtime::cap_host_memory(a, available) == 0);
  CHECK(a.cap() == (123u << 20));
  a.set_cap(before);
}
