// Every op case of the harness on the CPU backend: forward against the double
// reference, gradients against central finite differences.
#include <doctest/doctest.h>

#include <set>

#include "ops/ops.h"
#include "tests/harness/consistency.h"

using namespace ht;
using namespace ht::harness;

TEST_CASE("op consistency: every case matches its reference and finite differences") {
  for (const OpCase& c : all_op_cases()) {
    CAPTURE(c.name);
    for (uint64_t seed : {1u, 2u}) {
      Report f = check_forward(c, cpu_backend(), seed);
      CHECK_MESSAGE(f.ok, f.detail);
      Report g = check_gradients(c, cpu_backend(), seed);
      CHECK_MESSAGE(g.ok, g.detail);
      MESSAGE(c.name << " seed " << seed << ": forward error " << f.worst << ", gradient error "
                     << g.worst);
    }
  }
}

TEST_CASE("op consistency: the harness covers every differentiable op") {
  std::set<std::string> names;
  for (const OpCase& c : all_op_cases()) names.insert(c.name);
  for (const char* required :
       {"matmul", "batched_matmul", "add_broadcast_row", "sub_broadcast_both",
        "mul_broadcast_column", "div_broadcast", "neg", "add_scalar", "mul_scalar", "pow_scalar",
        "sum_non_adjacent_axes", "mean_keepdim", "max_two_axes", "exp", "log", "sqrt", "tanh",
        "relu", "gelu", "softmax_last_axis", "log_softmax", "cross_entropy_mean",
        "cross_entropy_sum", "layernorm", "embedding", "conv2d_pad1", "maxpool2d", "dropout",
        "concat", "slice", "where_broadcast", "causal_attention"})
    CHECK_MESSAGE(names.count(required), "no harness case named ", required);
}

TEST_CASE("op consistency: the harness catches a wrong gradient") {
  // A deliberately wrong op (forward x^2, backward claims 3x) must fail the check,
  // or the harness could pass anything.
  OpCase wrong{"wrong_square", {InputSpec{{4}, InputSpec::Kind::real, -1, 1, 0, 0}},
               [](const std::vector<Tensor>& x) { return mul(x[0], x[0]); },
               [](const std::vector<Values>& v) {
                 Values out(v[0].size());
                 for (size_t i = 0; i < out.size(); ++i) out[i] = 1.5 * v[0][i] * v[0][i];
                 return out;
               }};
  CHECK_FALSE(check_forward(wrong, cpu_backend()).ok);
  CHECK_FALSE(check_gradients(wrong, cpu_backend()).ok);
}

TEST_CASE("op consistency: the backend comparison runs every case") {
  // The CUDA suite compares each case with the CPU through check_against_cpu; here the
  // CPU against itself must agree exactly, which exercises the same path end to end.
  for (const OpCase& c : all_op_cases()) {
    CAPTURE(c.name);
    Report r = check_against_cpu(c, cpu_backend());
    CHECK_MESSAGE(r.ok, r.detail);
    CHECK(r.worst == 0.0);
  }
}

TEST_CASE("backend: the CPU backend answers its capability and memory queries") {
  Backend& be = cpu_backend();
  for (int k = 0; k < static_cast<int>(OpKind::count_); ++k)
    CHECK_MESSAGE(be.supports(static_cast<OpKind>(k)), op_kind_name(static_cast<OpKind>(k)));
  MemoryInfo m = be.memory_info();
  CHECK(m.total > (size_t{1} << 28));
  CHECK(m.available > 0);
  CHECK(m.available <= m.total);
}
