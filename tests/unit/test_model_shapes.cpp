// Planning from shapes: runtime::describe_model (the config alone, no weights, no data)
// must equal the figures of the model build_model makes, block by block, for every
// config under configs/ small enough to build here and for synthetic shapes that reach
// each branch of the Blocks' cost code (dropout, no hidden layer, odd sizes); a 7B-class
// model is described without the allocator handing out a byte. test_block_costs checks
// that the planner's costs from a description equal those from the built model.
#include <doctest/doctest.h>

#include "tests/unit/error_message.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "config/config.h"
#include "nn/block.h"
#include "nn/block_shape.h"
#include "nn/conv_block.h"
#include "nn/transformer_block.h"
#include "plan/cluster_model.h"
#include "runtime/task.h"

using namespace ht;
namespace fs = std::filesystem;

namespace {

// Building allocates and initialises every weight; beyond this many parameters (80 MB
// of fp32) a config is a planning example, described here but not built.
constexpr int64_t kMaxParamsToBuild = 20'000'000;

// The configs/ of the source tree: the catalogue the build bakes in sits there.
fs::path configs_dir() { return fs::path(plan::default_catalogue_path()).parent_path(); }

// Every block's figures, named by index, so that a mismatch says where it is.
void check_same(const nn::ModelShape& described, const nn::ModelShape& built, const std::string& what) {
  INFO(what);
  REQUIRE(described.size() == built.size());
  for (size_t i = 0; i < built.size(); ++i) {
    INFO("block " << i << " (" << built.blocks[i].kind << ")");
    const nn::BlockShape &d = described.blocks[i], &b = built.blocks[i];
    CHECK(d.kind == b.kind);
    CHECK(d.params == b.params);
    CHECK(d.flops_per_sample == b.flops_per_sample);
    CHECK(d.activation_bytes_per_sample == b.activation_bytes_per_sample);
    CHECK(d.workspace_bytes_per_sample == b.workspace_bytes_per_sample);
    CHECK(d.eval_bytes_per_sample == b.eval_bytes_per_sample);
    CHECK(d.eval_fused_bytes_per_sample == b.eval_fused_bytes_per_sample);
    CHECK(d.sample_input_shape == b.sample_input_shape);
    CHECK(d.sample_output_shape == b.sample_output_shape);
    CHECK(d.input_dtype == b.input_dtype);
  }
  CHECK(described == built);  // and nothing the field list above forgot
}

}  // namespace

TEST_CASE("model shapes: every config under configs/ is described as it builds") {
  std::set<std::string> compared, described_only;
  for (const auto& entry : fs::recursive_directory_iterator(configs_dir())) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    // The catalogue and cluster files are no configs (a cluster's "model" is a name).
    if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j["model"].is_object()) continue;
    const config::Config cfg = config::load_config(entry.path().string());
    const nn::ModelShape described = runtime::describe_model(cfg);
    const std::string name = fs::relative(entry.path(), configs_dir()).string();
    if (described.param_count() > kMaxParamsToBuild) {
      described_only.insert(name);
      continue;
    }
    check_same(described, nn::shape_of(runtime::build_model(cfg, cfg.train.seed)), name);
    compared.insert(name);
  }
  for (const std::string& name : described_only) MESSAGE("described, too large to build here: " << name);
  // The shipped runnable configs are among those compared: the loop found configs/.
  for (const char* shipped : {"fashion_mnist_mlp.json", "fashion_mnist_cnn.json", "text_gpt_tiny.json"})
    CHECK_MESSAGE(compared.count(shipped) == 1, shipped << " was not compared");
}

TEST_CASE("model shapes: synthetic shapes are described as they build") {
  struct Case {
    const char* what;
    config::ModelConfig model;
  };
  auto gpt = [](int64_t context, int64_t layers, int64_t heads, int64_t d_model, float dropout) {
    config::ModelConfig m;
    m.type = "gpt";
    m.context = context;
    m.layers = layers;
    m.heads = heads;
    m.d_model = d_model;
    m.dropout = dropout;
    return m;
  };
  auto cnn = [](std::vector<int64_t> channels, int64_t fc_hidden) {
    config::ModelConfig m;
    m.type = "cnn";
    m.channels = std::move(channels);
    m.fc_hidden = fc_hidden;
    return m;
  };
  auto mlp = [](std::vector<int64_t> hidden) {
    config::ModelConfig m;
    m.type = "mlp";
    m.hidden = std::move(hidden);
    return m;
  };
  const Case cases[] = {
      {"gpt 2x12/3, context 5, dropout 0.1", gpt(5, 2, 3, 12, 0.1f)},
      {"gpt 1x7/1, context 3", gpt(3, 1, 1, 7, 0.f)},
      {"cnn 3-5-2 (28 -> 14 -> 7 -> 3), hidden 9", cnn({3, 5, 2}, 9)},
      {"cnn 4, hidden 1", cnn({4}, 1)},
      {"mlp 784-10, no hidden layer", mlp({})},
      {"mlp 784-31-1-17-10", mlp({31, 1, 17})},
  };
  for (const Case& c : cases) {
    config::Config cfg;
    cfg.model = c.model;
    cfg.data.dataset = c.model.type == "gpt" ? "text" : "fashion_mnist";
    check_same(runtime::describe_model(cfg), nn::shape_of(runtime::build_model(cfg, 5)), c.what);
  }
}

TEST_CASE("model shapes: a 7B-class GPT is described without allocating a weight") {
  config::Config cfg;
  cfg.model.type = "gpt";
  cfg.model.context = 2048;
  cfg.model.layers = 32;
  cfg.model.heads = 32;
  cfg.model.d_model = 4096;
  Allocator& alloc = cpu_backend().allocator();
  const size_t live = alloc.live_bytes();
  alloc.reset_peak();
  const size_t peak = alloc.peak_bytes();
  const nn::ModelShape m = runtime::describe_model(cfg);
  CHECK(alloc.peak_bytes() == peak);
  CHECK(alloc.live_bytes() == live);
  // Hand count, d = 4096, T = 2048, V = 96: per layer 12d^2 + 13d (qkv d*3d + 3d, proj
  // d*d + d, fc1 d*4d + 4d, fc2 4d*d + d, two layernorms 4d); the embeddings V*d + T*d;
  // the head's layernorm 2d and projection d*V.
  const int64_t d = 4096, t = 2048, v = 96;
  REQUIRE(m.size() == 34);
  CHECK(m.blocks[1].params == 12 * d * d + 13 * d);
  CHECK(m.param_count() == 32 * (12 * d * d + 13 * d) + v * d + t * d + 2 * d + d * v);
  CHECK(m.param_count() > 6'000'000'000);
}

TEST_CASE("model shapes: a description refuses hyper-parameters the Block would") {
  CHECK(contains(error_of([] { nn::ConvBlock::describe(1, 4, 1, 1); }), "image 1x1"));
  const std::string e = error_of([] { nn::TransformerBlock::describe(10, 3, 4, 0.f); });
  CHECK(contains(e, "3 heads for model width 10"));
}
