// The graph machinery: accumulation, no_grad, detach, single use, and what ops keep.
#include <doctest/doctest.h>

#include "autograd/graph.h"
#include "core/error.h"
#include "ops/ops.h"

using namespace ht;

TEST_CASE("autograd: gradients accumulate across passes and through shared inputs") {
  Tensor x = Tensor::from_vector({1, 2, 3}, {3}, cpu_backend()).set_requires_grad();
  // y = sum(x * x + x): dy/dx = 2x + 1, with x used three times in one graph
  sum(add(mul(x, x), x)).backward();
  CHECK(x.grad().to_vector() == std::vector<float>{3, 5, 7});
  sum(mul(x, 2.f)).backward();  // accumulates
  CHECK(x.grad().to_vector() == std::vector<float>{5, 7, 9});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("autograd: two leaves fed the same gradient get separate buffers") {
  Tensor a = Tensor::from_vector({1, 2}, {2}, cpu_backend()).set_requires_grad();
  Tensor b = Tensor::from_vector({3, 4}, {2}, cpu_backend()).set_requires_grad();
  sum(add(a, b)).backward();
  sum(mul(a, 3.f)).backward();  // must not leak into b's gradient
  CHECK(a.grad().to_vector() == std::vector<float>{4, 4});
  CHECK(b.grad().to_vector() == std::vector<float>{1, 1});
}

TEST_CASE("autograd: no_grad and detach record nothing") {
  Tensor x = Tensor::from_vector({1, 2}, {2}, cpu_backend()).set_requires_grad();
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    CHECK_FALSE(mul(x, x).requires_grad());
  }
  CHECK(grad_enabled());
  Tensor d = x.detach();
  CHECK(d.same_storage(x));
  CHECK_FALSE(mul(d, d).requires_grad());
  // A detached branch contributes no gradient.
  sum(add(mul(x, d), 0.f)).backward();
  CHECK(x.grad().to_vector() == std::vector<float>{1, 2});
}

TEST_CASE("autograd: a graph runs backward once, and only from a result") {
  Tensor x = Tensor::from_vector({1, 2}, {2}, cpu_backend()).set_requires_grad();
  Tensor y = sum(exp(x));
  y.backward();
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("already run backward"), Error);
  Tensor plain = Tensor::from_vector({1}, {1}, cpu_backend());
  CHECK_THROWS_WITH_AS(plain.backward(), doctest::Contains("does not require a gradient"), Error);
  CHECK_THROWS_WITH_AS(exp(x).backward(), doctest::Contains("single element"), Error);
}

TEST_CASE("autograd: an op keeps an input only when its backward needs it") {
  Allocator& a = cpu_backend().allocator();
  Tensor w = Tensor::full({1000}, 2.f, cpu_backend()).set_requires_grad();
  size_t base = a.live_bytes();
  const size_t block = 4032;  // 1000 floats, rounded by the allocator

  Tensor y_add;
  {
    Tensor tmp = Tensor::full({1000}, 3.f, cpu_backend());
    y_add = add(w, tmp);  // add's backward needs no values
  }
  CHECK(a.live_bytes() == base + block);  // only the output

  Tensor y_mul;
  {
    Tensor tmp = Tensor::full({1000}, 3.f, cpu_backend());
    y_mul = mul(w, tmp);  // d/dw needs tmp; nothing needs w's values
  }
  CHECK(a.live_bytes() == base + 3 * block);  // y_add, y_mul, tmp

  // Running backward frees what the graph kept.
  sum(y_mul).backward();
  y_mul = Tensor();
  y_add = Tensor();
  w.zero_grad();
  CHECK(a.live_bytes() == base);
}
