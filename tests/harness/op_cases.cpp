// One case per op (and per distinct fast path of an op: broadcasting, transposed
// operands, non-last axes). Adding an op means adding its case here.
#include <cmath>

#include "backend/backend.h"
#include "ops/ops.h"
#include "tests/harness/op_case.h"
#include "tests/harness/reference.h"

namespace ht::harness {

namespace {

using K = InputSpec::Kind;

InputSpec real(Shape s, double lo = -1, double hi = 1, double min_abs = 0) {
  return {std::move(s), K::real, lo, hi, min_abs, 0};
}
InputSpec mask(Shape s) { return {std::move(s), K::mask, 0, 1, 0, 0}; }
InputSpec index(Shape s, int32_t bound) { return {std::move(s), K::index, 0, 0, 0, bound}; }

OpCase unary_case(std::string name, Tensor (*op)(const Tensor&), double (*f)(double),
                  double lo = -1, double hi = 1, double min_abs = 0) {
  return {std::move(name), {real({3, 5}, lo, hi, min_abs)},
          [op](const std::vector<Tensor>& x) { return op(x[0]); },
          [f](const std::vector<Values>& v) { return ref::map(v[0], f); }};
}

OpCase binary_case(std::string name, Tensor (*op)(const Tensor&, const Tensor&),
                   double (*f)(double, double), Shape sa, Shape sb, double blo = -1,
                   double bhi = 1) {
  return {std::move(name), {real(sa), real(sb, blo, bhi)},
          [op](const std::vector<Tensor>& x) { return op(x[0], x[1]); },
          [f, sa, sb](const std::vector<Values>& v) { return ref::broadcast(v[0], sa, v[1], sb, f); }};
}

double gelu_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

std::vector<OpCase> build() {
  std::vector<OpCase> cases;
  auto add_case = [&](OpCase c) { cases.push_back(std::move(c)); };

  // ---- matrix products
  add_case({"matmul", {real({3, 4}), real({4, 5})},
            [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
            [](const std::vector<Values>& v) { return ref::matmul(v[0], v[1], 1, 3, 4, 5, true); }});
  add_case({"matmul_transposed_operands", {real({4, 3}), real({5, 4})},
            [](const std::vector<Tensor>& x) {
              return matmul(transpose(x[0], 0, 1), transpose(x[1], 0, 1));
            },
            [](const std::vector<Values>& v) {
              return ref::matmul(ref::permute(v[0], {4, 3}, {1, 0}),
                                 ref::permute(v[1], {5, 4}, {1, 0}), 1, 3, 4, 5, true);
            }});
  add_case({"matmul_shared_rhs", {real({2, 3, 4}), real({4, 5})},
            [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
            [](const std::vector<Values>& v) { return ref::matmul(v[0], v[1], 2, 3, 4, 5, true); }});
  add_case({"batched_matmul", {real({2, 3, 4}), real({2, 4, 5})},
            [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
            [](const std::vector<Values>& v) { return ref::matmul(v[0], v[1], 2, 3, 4, 5, false); }});

  // ---- broadcasting binary ops
  add_case(binary_case("add_broadcast_row", add, [](double a, double b) { return a + b; },
                       {3, 4}, {4}));
  add_case(binary_case("sub_broadcast_both", sub, [](double a, double b) { return a - b; },
                       {2, 1, 4}, {3, 1}));
  add_case(binary_case("mul_broadcast_column", mul, [](double a, double b) { return a * b; },
                       {3, 4}, {3, 1}));
  add_case(binary_case("mul_same_shape", mul, [](double a, double b) { return a * b; }, {2, 3, 4},
                       {2, 3, 4}));
  add_case(binary_case("div_broadcast", div, [](double a, double b) { return a / b; }, {3, 4},
                       {4}, 0.5, 2.0));

  // ---- scalar ops
  add_case({"add_scalar", {real({3, 4})},
            [](const std::vector<Tensor>& x) { return add(x[0], 0.75f); },
            [](const std::vector<Values>& v) { return ref::map(v[0], [](double a) { return a + 0.75; }); }});
  add_case({"mul_scalar", {real({3, 4})},
            [](const std::vector<Tensor>& x) { return mul(x[0], -1.5f); },
            [](const std::vector<Values>& v) { return ref::map(v[0], [](double a) { return a * -1.5; }); }});
  add_case({"div_scalar", {real({3, 4})},
            [](const std::vector<Tensor>& x) { return div(x[0], 4.f); },
            [](const std::vector<Values>& v) { return ref::map(v[0], [](double a) { return a / 4; }); }});
  add_case({"pow_scalar", {real({3, 4}, 0.5, 2)},
            [](const std::vector<Tensor>& x) { return pow(x[0], 1.5f); },
            [](const std::vector<Values>& v) { return ref::map(v[0], [](double a) { return std::pow(a, 1.5); }); }});
  add_case(unary_case("neg", neg, [](double a) { return -a; }));

  // ---- unary math
  add_case(unary_case("exp", exp, [](double a) { return std::exp(a); }));
  add_case(unary_case("log", log, [](double a) { return std::log(a); }, 0.5, 2));
  add_case(unary_case("sqrt", sqrt, [](double a) { return std::sqrt(a); }, 0.5, 2));
  add_case(unary_case("tanh", tanh, [](double a) { return std::tanh(a); }, -2, 2));
  add_case(unary_case("relu", relu, [](double a) { return a > 0 ? a : 0.0; }, -1, 1, 0.05));
  add_case(unary_case("gelu", gelu, gelu_ref, -3, 3));

  // ---- reductions
  add_case({"sum_non_adjacent_axes", {real({2, 3, 4})},
            [](const std::vector<Tensor>& x) { return sum(x[0], {0, 2}); },
            [](const std::vector<Values>& v) { return ref::reduce(v[0], {2, 3, 4}, {0, 2}, false); }});
  add_case({"sum_all", {real({3, 4})},
            [](const std::vector<Tensor>& x) { return sum(x[0]); },
            [](const std::vector<Values>& v) { return ref::reduce(v[0], {3, 4}, {0, 1}, false); }});
  add_case({"mean_keepdim", {real({2, 3, 4})},
            [](const std::vector<Tensor>& x) { return mean(x[0], {1}, true); },
            [](const std::vector<Values>& v) {
              return ref::map(ref::reduce(v[0], {2, 3, 4}, {1}, false), [](double a) { return a / 3; });
            }});
  add_case({"max_one_axis", {real({3, 5})},
            [](const std::vector<Tensor>& x) { return max(x[0], {1}); },
            [](const std::vector<Values>& v) { return ref::reduce(v[0], {3, 5}, {1}, true); }});
  add_case({"max_two_axes", {real({2, 3, 4})},
            [](const std::vector<Tensor>& x) { return max(x[0], {0, 2}); },
            [](const std::vector<Values>& v) { return ref::reduce(v[0], {2, 3, 4}, {0, 2}, true); }});

  // ---- normalisation and losses
  add_case({"softmax_last_axis", {real({3, 5}, -2, 2)},
            [](const std::vector<Tensor>& x) { return softmax(x[0], -1); },
            [](const std::vector<Values>& v) { return ref::softmax_rows(v[0], 3, 5, false); }});
  add_case({"softmax_first_axis", {real({4, 3}, -2, 2)},
            [](const std::vector<Tensor>& x) { return softmax(x[0], 0); },
            [](const std::vector<Values>& v) {
              Values t = ref::permute(v[0], {4, 3}, {1, 0});
              return ref::permute(ref::softmax_rows(t, 3, 4, false), {3, 4}, {1, 0});
            }});
  add_case({"log_softmax", {real({3, 5}, -2, 2)},
            [](const std::vector<Tensor>& x) { return log_softmax(x[0]); },
            [](const std::vector<Values>& v) { return ref::softmax_rows(v[0], 3, 5, true); }});
  add_case({"cross_entropy_mean", {real({4, 5}, -2, 2), index({4}, 5)},
            [](const std::vector<Tensor>& x) { return cross_entropy(x[0], x[1]); },
            [](const std::vector<Values>& v) {
              return ref::map(ref::reduce(ref::cross_entropy_rows(v[0], v[1], 4, 5), {4}, {0}, false),
                              [](double a) { return a / 4; });
            }});
  add_case({"cross_entropy_sum", {real({4, 5}, -2, 2), index({4}, 5)},
            [](const std::vector<Tensor>& x) { return cross_entropy(x[0], x[1], Reduction::sum); },
            [](const std::vector<Values>& v) {
              return ref::reduce(ref::cross_entropy_rows(v[0], v[1], 4, 5), {4}, {0}, false);
            }});
  add_case({"layernorm", {real({3, 6}, -2, 2), real({6}, 0.5, 1.5), real({6})},
            [](const std::vector<Tensor>& x) { return layernorm(x[0], x[1], x[2]); },
            [](const std::vector<Values>& v) { return ref::layernorm(v[0], v[1], v[2], 3, 6, 1e-5); }});

  // ---- lookups, convolution, pooling
  add_case({"embedding", {real({5, 3}), index({2, 3}, 5)},
            [](const std::vector<Tensor>& x) { return embedding(x[0], x[1]); },
            [](const std::vector<Values>& v) {
              Values out;
              for (double id : v[1])
                for (int64_t j = 0; j < 3; ++j) out.push_back(v[0][static_cast<int64_t>(id) * 3 + j]);
              return out;
            }});
  add_case({"conv2d_pad1", {real({2, 3, 5, 5}), real({4, 3, 3, 3}), real({4})},
            [](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], x[2], 1, 1); },
            [](const std::vector<Values>& v) { return ref::conv2d(v[0], v[1], v[2], 2, 3, 5, 5, 4, 3, 1, 1); }});
  add_case({"conv2d_stride2_nobias", {real({1, 2, 6, 6}), real({3, 2, 3, 3})},
            [](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], Tensor(), 2, 0); },
            [](const std::vector<Values>& v) { return ref::conv2d(v[0], v[1], {}, 1, 2, 6, 6, 3, 3, 2, 0); }});
  add_case({"conv2d_stride2_pad1", {real({2, 2, 5, 6}), real({3, 2, 3, 3}), real({3})},
            [](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], x[2], 2, 1); },
            [](const std::vector<Values>& v) { return ref::conv2d(v[0], v[1], v[2], 2, 2, 5, 6, 3, 3, 2, 1); }});
  add_case({"maxpool2d", {real({2, 2, 4, 4})},
            [](const std::vector<Tensor>& x) { return maxpool2d(x[0], 2, 2); },
            [](const std::vector<Values>& v) { return ref::maxpool2d(v[0], 2, 2, 4, 4, 2, 2); }});
  // Overlapping windows: an input pixel under several windows sums their gradients.
  add_case({"maxpool2d_overlapping", {real({2, 3, 7, 6})},
            [](const std::vector<Tensor>& x) { return maxpool2d(x[0], 3, 2); },
            [](const std::vector<Values>& v) { return ref::maxpool2d(v[0], 2, 3, 7, 6, 3, 2); }});
  add_case({"conv2d_wide_window", {real({2, 4, 7, 7}), real({5, 4, 5, 5}), real({5})},
            [](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], x[2], 1, 2); },
            [](const std::vector<Values>& v) { return ref::conv2d(v[0], v[1], v[2], 2, 4, 7, 7, 5, 5, 1, 2); }});

  // ---- randomness, selection, joins and views
  add_case({"dropout", {real({3, 8})},
            [](const std::vector<Tensor>& x) { return dropout(x[0], 0.3f, 42, 7); },
            [](const std::vector<Values>& v) {
              Values out(v[0].size());
              for (size_t i = 0; i < out.size(); ++i)
                out[i] = counter_uniform(42, 7 + i) >= 0.3f ? v[0][i] / (1 - 0.3f) : 0.0;
              return out;
            }});
  add_case({"where_broadcast", {mask({3, 4}), real({3, 4}), real({4})},
            [](const std::vector<Tensor>& x) { return where(x[0], x[1], x[2]); },
            [](const std::vector<Values>& v) {
              Values b = ref::expand(v[2], {4}, {3, 4});
              Values out(12);
              for (size_t i = 0; i < 12; ++i) out[i] = v[0][i] != 0 ? v[1][i] : b[i];
              return out;
            }});
  add_case({"concat", {real({2, 3}), real({2, 2})},
            [](const std::vector<Tensor>& x) { return concat({x[0], x[1]}, 1); },
            [](const std::vector<Values>& v) {
              Values out;
              for (int64_t r = 0; r < 2; ++r) {
                for (int64_t j = 0; j < 3; ++j) out.push_back(v[0][r * 3 + j]);
                for (int64_t j = 0; j < 2; ++j) out.push_back(v[1][r * 2 + j]);
              }
              return out;
            }});
  add_case({"slice", {real({3, 5})},
            [](const std::vector<Tensor>& x) { return slice(x[0], 1, 1, 4); },
            [](const std::vector<Values>& v) {
              Values out;
              for (int64_t r = 0; r < 3; ++r)
                for (int64_t j = 1; j < 4; ++j) out.push_back(v[0][r * 5 + j]);
              return out;
            }});
  add_case({"permute_then_reshape", {real({2, 3, 4})},
            [](const std::vector<Tensor>& x) { return reshape(permute(x[0], {2, 0, 1}), {4, 6}); },
            [](const std::vector<Values>& v) { return ref::permute(v[0], {2, 3, 4}, {2, 0, 1}); }});
  add_case({"transpose_contiguous", {real({3, 4})},
            [](const std::vector<Tensor>& x) { return contiguous(transpose(x[0], 0, 1)); },
            [](const std::vector<Values>& v) { return ref::permute(v[0], {3, 4}, {1, 0}); }});
  add_case({"expand_then_mul", {real({3, 1}), real({2, 3, 4})},
            [](const std::vector<Tensor>& x) { return mul(expand(x[0], {2, 3, 4}), x[1]); },
            [](const std::vector<Values>& v) {
              Values e = ref::expand(v[0], {3, 1}, {2, 3, 4});
              for (size_t i = 0; i < e.size(); ++i) e[i] *= v[1][i];
              return e;
            }});

  // ---- attention
  add_case({"causal_attention", {real({1, 2, 4, 3}), real({1, 2, 4, 3}), real({1, 2, 4, 3})},
            [](const std::vector<Tensor>& x) { return causal_attention(x[0], x[1], x[2]); },
            [](const std::vector<Values>& v) { return ref::causal_attention(v[0], v[1], v[2], 2, 4, 3); }});
  // More keys than one warp's tile of the fused GPU kernel, and a head size that is not
  // a multiple of its lanes.
  add_case({"causal_attention_long", {real({1, 2, 37, 5}), real({1, 2, 37, 5}), real({1, 2, 37, 5})},
            [](const std::vector<Tensor>& x) { return causal_attention(x[0], x[1], x[2]); },
            [](const std::vector<Values>& v) { return ref::causal_attention(v[0], v[1], v[2], 2, 37, 5); }});
  return cases;
}

}  // namespace

const std::vector<OpCase>& all_op_cases() {
  static const std::vector<OpCase> cases = build();
  return cases;
}

}  // namespace ht::harness
