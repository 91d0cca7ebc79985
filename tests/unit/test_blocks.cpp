// Blocks and model builders: the planner's figures (parameters, FLOPs, activation
// bytes) against hand counts and against the allocator, model shapes, gradients
// reaching every parameter, and errors for bad inputs.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"

#include <algorithm>
#include <memory>
#include <string>

#include "autograd/graph.h"
#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/models.h"
#include "nn/block.h"
#include "ops/ops.h"

using namespace ht;

namespace {

// Small models whose figures are counted by hand below.
models::MlpSpec small_mlp() { return {6, {5, 4}, 3}; }
models::CnnSpec small_cnn() { return {1, 8, {2, 3}, 4, 3}; }
models::GptSpec small_gpt(float dropout = 0.f) {
  models::GptSpec s;
  s.vocab = 11;
  s.context = 4;  // T
  s.layers = 1;
  s.heads = 2;    // H
  s.d_model = 8;  // C
  s.dropout = dropout;
  return s;
}

// A batch of the block's sample input: uniform floats, or token ids below `vocab`.
Tensor sample_batch(const nn::Block& block, int64_t batch, Rng& rng, int64_t vocab = 2) {
  Shape shape{batch};
  for (int64_t d : block.sample_input_shape()) shape.push_back(d);
  if (block.input_dtype() == DType::i32) {
    std::vector<int32_t> ids(static_cast<size_t>(numel(shape)));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    return Tensor::from_ints(ids, shape, cpu_backend());
  }
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (float& x : v) x = rng.uniform(-1.f, 1.f);
  return Tensor::from_vector(v, shape, cpu_backend());
}

struct Figures {
  int64_t params, flops, act_bytes;
};

void check_figures(const nn::Sequential& model, const std::vector<Figures>& expected) {
  REQUIRE(model.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CAPTURE(model.block(i).kind());
    CHECK(model.block(i).param_count() == expected[i].params);
    CHECK(model.block(i).flops_per_sample() == expected[i].flops);
    CHECK(model.block(i).activation_bytes_per_sample() == expected[i].act_bytes);
  }
}

// Bytes the allocator holds after one forward at `batch` because of that forward.
// The input is made inside the window and our handle dropped, so it stays counted
// exactly when an op keeps it (which the block's figure says it does). The output is
// counted while alive (`with_output`), then dropped while its grad_fn is kept: what
// remains is what the autograd graph keeps for backward, i.e. the activation figure
// (the output stays counted only when an op in the block keeps it, e.g. a ReLU).
struct Measured {
  int64_t with_output, graph_only;
};

Measured measure_forward(nn::Block& block, int64_t batch, Rng& rng, int64_t vocab = 2) {
  Allocator& alloc = cpu_backend().allocator();
  const int64_t before = static_cast<int64_t>(alloc.live_bytes());
  Measured m{};
  std::shared_ptr<Node> graph;
  {
    Tensor x = sample_batch(block, batch, rng, vocab);
    if (x.dtype() == DType::f32) x.set_requires_grad(true);  // as a mid-pipeline stage's input
    Tensor y = block.forward(x);
    x = Tensor();
    graph = y.impl()->grad_fn;
    REQUIRE(graph != nullptr);
    m.with_output = static_cast<int64_t>(alloc.live_bytes()) - before;
  }
  m.graph_only = static_cast<int64_t>(alloc.live_bytes()) - before;
  graph.reset();
  CHECK(static_cast<int64_t>(alloc.live_bytes()) == before);  // nothing leaked
  return m;
}

// Checks activation_bytes_per_sample() against the allocator for every block.
//
// Tolerance: the allocator rounds each tensor up to 64 bytes and a few buffers do
// not grow with the batch (the T x T causal mask). With batches that are multiples
// of 16, every per-sample tensor of n floats or ints takes 4 * n * batch bytes, a
// multiple of 64, so no rounding occurs and the growth from 16 to 32 samples divided
// by 16 must equal the figure exactly; the fixed remainder must stay within
// `fixed_bytes`. At an odd batch (3) rounding is real: the measured bytes per sample
// may exceed the figure by at most (64 * tensors + fixed_bytes) / 3, with `tensors`
// a generous bound on how many buffers a block keeps (the transformer keeps 11).
void check_measured_activations(const nn::Sequential& model, int64_t vocab,
                                int64_t fixed_bytes) {
  const int64_t tensors = 16;
  Rng rng(7);
  for (size_t i = 0; i < model.size(); ++i) {
    nn::Block& block = model.block(i);
    CAPTURE(i);
    CAPTURE(block.kind());
    const int64_t figure = block.activation_bytes_per_sample();
    Measured m16 = measure_forward(block, 16, rng, vocab);
    Measured m32 = measure_forward(block, 32, rng, vocab);
    CHECK((m32.graph_only - m16.graph_only) / 16 == figure);
    CHECK((m32.graph_only - m16.graph_only) % 16 == 0);
    const int64_t fixed = m16.graph_only - 16 * figure;
    CHECK(fixed >= 0);
    CHECK(fixed <= fixed_bytes);
    // The output, while alive, adds its own bytes unless an op already keeps it.
    const int64_t out_bytes = 4 * 16 * numel(block.sample_output_shape());
    const int64_t extra = m16.with_output - m16.graph_only;
    CHECK((extra == 0 || extra == out_bytes));

    Measured m3 = measure_forward(block, 3, rng, vocab);
    CHECK(m3.graph_only >= 3 * figure);
    CHECK(m3.graph_only - 3 * figure <= 64 * tensors + fixed_bytes);
  }
}

void check_every_parameter_has_a_gradient(const nn::Sequential& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    CAPTURE(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().shape() == p.shape());
  }
}


}  // namespace

// ---- hand counts. Conventions (src/nn/cost_model.h): 2 FLOPs per multiply-add; 1 per
// elementwise op per value; 2x2 pooling 3 comparisons per output; layernorm 7 and
// softmax 5 per value. Bytes are 4 per float or int32 kept for backward.

TEST_CASE("blocks: MLP figures match hand counts") {
  nn::Sequential m = models::build_mlp(small_mlp(), 1);
  check_figures(m, {
      // 6 -> 5 ReLU: W 5x6 + b; 2*6*5 MACs + 5 bias + 5 ReLU; keeps input (6) + ReLU out (5)
      {6 * 5 + 5, 2 * 6 * 5 + 5 + 5, (6 + 5) * 4},
      // 5 -> 4 ReLU
      {5 * 4 + 4, 2 * 5 * 4 + 4 + 4, (5 + 4) * 4},
      // 4 -> 3, no ReLU: keeps its input only
      {4 * 3 + 3, 2 * 4 * 3 + 3, 4 * 4},
  });
  CHECK(m.param_count() == 35 + 24 + 15);
}

TEST_CASE("blocks: CNN figures match hand counts") {
  nn::Sequential m = models::build_cnn(small_cnn(), 1);
  check_figures(m, {
      // conv 1->2 3x3 on 8x8 (pad 1 keeps 8x8), ReLU, pool to 4x4:
      // params 2*1*9 + 2; FLOPs 2*(2*64)*(1*9) + 2*64 bias + 2*64 ReLU + 3*(2*16) pool;
      // keeps input 1*64, ReLU out 2*64 floats, argmax 2*16 int32
      {2 * 1 * 9 + 2, 2 * (2 * 64) * (1 * 9) + 2 * 64 + 2 * 64 + 3 * (2 * 16),
       (1 * 64 + 2 * 64 + 2 * 16) * 4},
      // conv 2->3 on 4x4, pool to 2x2
      {3 * 2 * 9 + 3, 2 * (3 * 16) * (2 * 9) + 3 * 16 + 3 * 16 + 3 * (3 * 4),
       (2 * 16 + 3 * 16 + 3 * 4) * 4},
      // flatten 3*2*2 = 12 -> 4 ReLU
      {12 * 4 + 4, 2 * 12 * 4 + 4 + 4, (12 + 4) * 4},
      // 4 -> 3
      {4 * 3 + 3, 2 * 4 * 3 + 3, 4 * 4},
  });
}

TEST_CASE("blocks: transformer figures match hand counts") {
  const int64_t V = 11, T = 4, H = 2, C = 8, D = C / H;
  nn::Sequential m = models::build_gpt(small_gpt(), 1);
  const int64_t tc = T * C;
  // Transformer block, op by op.
  const int64_t params = (2 * C)                // ln1 gamma, beta
                         + (C * 3 * C + 3 * C)  // qkv
                         + (C * C + C)          // proj
                         + (2 * C)              // ln2
                         + (C * 4 * C + 4 * C)  // fc1
                         + (4 * C * C + C);     // fc2
  const int64_t flops = 7 * tc                       // ln1
                        + 2 * T * C * 3 * C + 3 * tc  // qkv + bias
                        + H * 2 * T * T * D           // q @ k^T per head
                        + H * T * T                   // scale
                        + H * T * T                   // causal mask select
                        + 5 * H * T * T               // softmax
                        + H * 2 * T * T * D           // att @ v per head
                        + 2 * T * C * C + tc          // proj + bias
                        + tc                          // residual
                        + 7 * tc                      // ln2
                        + 2 * T * C * 4 * C + 4 * tc  // fc1 + bias
                        + 4 * tc                      // GELU
                        + 2 * T * 4 * C * C + tc      // fc2 + bias
                        + tc;                         // residual
  const int64_t floats = (tc + 2 * T)  // ln1: x, mean, 1/std
                         + tc          // ln1 out (qkv's input)
                         + 3 * tc      // attention: dense q, k, v
                         + tc          // attention out
                         + H * T       // attention rows' log-sum-exps
                         + tc          // merged heads (proj's input)
                         + (tc + 2 * T)  // ln2: residual sum, mean, 1/std
                         + tc            // ln2 out (fc1's input)
                         + 4 * tc        // GELU input
                         + 4 * tc;       // GELU output (fc2's input)
  check_figures(m, {
      // token table V x C + positions T x C; position add; keeps the int32 ids
      {V * C + T * C, tc, T * 4},
      {params, flops, floats * 4},
      // final LN + head C x V, no bias; keeps LN input, mean, 1/std, LN output
      {2 * C + C * V, 7 * tc + 2 * T * C * V, (tc + 2 * T + tc) * 4},
  });
  CHECK(params == 872);
  CHECK(flops == 7808);
  CHECK(floats * 4 == 2272);

  // Dropout on the embedding and both residual branches: one multiply per value and
  // a float mask per site.
  nn::Sequential d = models::build_gpt(small_gpt(0.1f), 1);
  CHECK(d.block(0).flops_per_sample() == tc + tc);
  CHECK(d.block(0).activation_bytes_per_sample() == T * 4 + tc * 4);
  CHECK(d.block(1).flops_per_sample() == flops + 2 * tc);
  CHECK(d.block(1).activation_bytes_per_sample() == (floats + 2 * tc) * 4);
}

// ---- the figures are what the allocator sees

TEST_CASE("blocks: measured activation bytes match the figures (small models)") {
  SUBCASE("mlp") { check_measured_activations(models::build_mlp(small_mlp(), 2), 2, 0); }
  SUBCASE("cnn") { check_measured_activations(models::build_cnn(small_cnn(), 2), 2, 0); }
  // The fixed part: the T x T float causal mask `where` keeps, 4*4*4 = 64 bytes.
  SUBCASE("gpt") { check_measured_activations(models::build_gpt(small_gpt(), 2), 11, 64); }
  SUBCASE("gpt with dropout") {
    check_measured_activations(models::build_gpt(small_gpt(0.2f), 2), 11, 64);
  }
}

TEST_CASE("blocks: measured activation bytes match the figures (default models)") {
  SUBCASE("mlp") { check_measured_activations(models::build_mlp({}, 3), 2, 0); }
  SUBCASE("cnn") { check_measured_activations(models::build_cnn({}, 3), 2, 0); }
  // Causal mask 128 x 128 floats.
  SUBCASE("gpt") { check_measured_activations(models::build_gpt({}, 3), 96, 128 * 128 * 4); }
}

// ---- shapes, gradients, errors

TEST_CASE("blocks: models produce the stated shapes and every parameter gets a gradient") {
  Rng rng(11);
  SUBCASE("mlp, flat and image input") {
    nn::Sequential m = models::build_mlp({}, 5);
    CHECK(m.param_count() == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
    Tensor flat = Tensor::full({3, 784}, 0.5f, cpu_backend());
    CHECK(m.forward(flat).shape() == Shape{3, 10});
    Tensor images = Tensor::full({3, 1, 28, 28}, 0.5f, cpu_backend());
    Tensor logits = m.forward(images);
    REQUIRE(logits.shape() == Shape{3, 10});
    cross_entropy(logits, Tensor::from_ints({1, 2, 3}, {3}, cpu_backend())).backward();
    check_every_parameter_has_a_gradient(m);
  }
  SUBCASE("cnn") {
    nn::Sequential m = models::build_cnn({}, 5);
    CHECK(m.block(0).sample_output_shape() == Shape{32, 14, 14});
    CHECK(m.block(1).sample_output_shape() == Shape{64, 7, 7});
    CHECK(m.block(2).sample_input_shape() == Shape{64, 7, 7});
    Tensor logits = m.forward(sample_batch(m.block(0), 2, rng));
    REQUIRE(logits.shape() == Shape{2, 10});
    cross_entropy(logits, Tensor::from_ints({0, 9}, {2}, cpu_backend())).backward();
    check_every_parameter_has_a_gradient(m);
  }
  SUBCASE("gpt, full context and shorter") {
    models::GptSpec spec;
    spec.dropout = 0.1f;
    nn::Sequential m = models::build_gpt(spec, 5);
    CHECK(m.size() == 6);
    Tensor ids = sample_batch(m.block(0), 2, rng, 96);
    Tensor logits = m.forward(ids);
    REQUIRE(logits.shape() == Shape{2, 128, 96});
    CHECK(m.forward(slice(ids, 1, 0, 17)).shape() == Shape{2, 17, 96});
    Tensor targets = sample_batch(m.block(0), 2, rng, 96);
    cross_entropy(reshape(logits, {-1, 96}), reshape(targets, {-1})).backward();
    check_every_parameter_has_a_gradient(m);
  }
}

TEST_CASE("blocks: builders are deterministic in the seed; dropout only in training") {
  Rng rng(3);
  nn::Sequential a = models::build_gpt(small_gpt(0.5f), 9);
  nn::Sequential b = models::build_gpt(small_gpt(0.5f), 9);
  nn::Sequential c = models::build_gpt(small_gpt(0.5f), 10);
  auto pa = a.parameters(), pb = b.parameters(), pc = c.parameters();
  CHECK(pa[0].to_vector() == pb[0].to_vector());
  CHECK(pa[0].to_vector() != pc[0].to_vector());
  // Dropout does not change the initial weights.
  nn::Sequential nodrop = models::build_gpt(small_gpt(0.f), 9);
  CHECK(nodrop.parameters().back().to_vector() == pa.back().to_vector());

  Tensor ids = sample_batch(a.block(0), 2, rng, 11);
  std::vector<float> first = a.forward(ids).to_vector();
  CHECK(first == b.forward(ids).to_vector());  // same seeds, same masks
  CHECK(first != a.forward(ids).to_vector());  // the offset advanced: a fresh mask
  a.set_training(false);
  nodrop.set_training(false);
  CHECK(a.forward(ids).to_vector() == nodrop.forward(ids).to_vector());
}

TEST_CASE("blocks: a build that keeps some blocks releases the others' weights as each is made") {
  // A rank of a pipeline keeps its stage's blocks only (runtime/trainer.cpp): the same
  // seed gives its blocks the whole build's values, and the others' weights are gone
  // before the next block is made.
  const nn::Sequential whole = models::build_gpt(small_gpt(), 9);
  Allocator& alloc = cpu_backend().allocator();
  const auto rounded = [](const Tensor& t) { return (static_cast<size_t>(t.numel()) * 4 + 63) & ~size_t{63}; };
  size_t kept = 0, largest_other = 0;
  for (size_t b = 0; b < whole.size(); ++b) {
    size_t block = 0;
    for (const auto& [name, p] : whole.block(b).named_parameters()) block += rounded(p);
    if (b == 2) kept = block;
    else largest_other = std::max(largest_other, block);
  }
  const size_t live = alloc.live_bytes();
  alloc.reset_peak();
  nn::Sequential part = [] {
    nn::Sequential::KeepOnly keep([](size_t b) { return b == 2; });
    return models::build_gpt(small_gpt(), 9);
  }();
  REQUIRE(part.size() == whole.size());
  for (size_t b = 0; b < whole.size(); ++b) {
    const auto mine = part.block(b).named_parameters(), all = whole.block(b).named_parameters();
    REQUIRE(mine.size() == all.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      CHECK(mine[i].second.shape() == all[i].second.shape());
      CHECK(mine[i].second.released() == (b != 2));
      if (b == 2) CHECK(mine[i].second.to_vector() == all[i].second.to_vector());
    }
  }
  // What stays is the kept block's weights; at most one other block's were ever held.
  CHECK(alloc.live_bytes() - live == kept);
  CHECK(alloc.peak_bytes() - live <= kept + largest_other);
  // A released weight is an error to read, naming it as such.
  CHECK(contains(error_of([&] { (void)part.block(0).named_parameters()[0].second.to_vector(); }), "was released"));
  // Outside the scope every block keeps its weights.
  const nn::Sequential again = models::build_gpt(small_gpt(), 9);
  for (const auto& [name, p] : again.named_parameters()) CHECK(!p.released());
}

TEST_CASE("blocks: bad input raises an error naming the block and the shapes") {
  nn::Sequential mlp = models::build_mlp({}, 1);
  std::string e = error_of([&] { mlp.forward(Tensor::zeros({2, 783}, cpu_backend())); });
  CHECK(contains(e, "dense_relu block"));
  CHECK(contains(e, "[2, 783]"));
  CHECK(contains(e, "(B, 784)"));
  e = error_of([&] { mlp.forward(Tensor::from_ints({1, 2}, {1, 2}, cpu_backend())); });
  CHECK(contains(e, "int32"));
  CHECK(contains(e, "float32"));

  nn::Sequential cnn = models::build_cnn({}, 1);
  e = error_of([&] { cnn.forward(Tensor::zeros({2, 3, 28, 28}, cpu_backend())); });
  CHECK(contains(e, "conv_relu_pool block"));
  CHECK(contains(e, "[2, 3, 28, 28]"));
  CHECK(contains(e, "(B, 1, 28, 28)"));
  e = error_of([&] { cnn.forward_range(Tensor::zeros({2, 64, 7, 8}, cpu_backend()), 2, 4); });
  CHECK(contains(e, "dense_relu block"));
  CHECK(contains(e, "[2, 64, 7, 8]"));

  nn::Sequential gpt = models::build_gpt({}, 1);
  e = error_of([&] { gpt.forward(Tensor::zeros({2, 16}, cpu_backend())); });
  CHECK(contains(e, "token_embedding block"));
  CHECK(contains(e, "float32"));
  CHECK(contains(e, "int32"));
  e = error_of([&] { gpt.forward(Tensor::from_ints(std::vector<int32_t>(2 * 129, 0), {2, 129}, cpu_backend())); });
  CHECK(contains(e, "[2, 129]"));
  CHECK(contains(e, "T <= 128"));
  e = error_of([&] { gpt.forward_range(Tensor::zeros({2, 16, 64}, cpu_backend()), 1, 2); });
  CHECK(contains(e, "transformer block"));
  CHECK(contains(e, "[2, 16, 64]"));
  CHECK(contains(e, "(B, T, 128)"));
  e = error_of([&] { gpt.forward_range(Tensor::zeros({2, 16, 127}, cpu_backend()), 5, 6); });
  CHECK(contains(e, "lm_head block"));
  e = error_of([&] { gpt.forward(Tensor::from_ints({0, 96}, {1, 2}, cpu_backend())); });
  CHECK(contains(e, "id 96"));  // an out-of-vocabulary id, named by value (by the op)
}
