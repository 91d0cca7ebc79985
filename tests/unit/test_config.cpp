// Configs: the shipped ones load, to_json round-trips, defaults are filled in, and every
// entry of tests/e2e/bad_configs.json fails with its expected one-line message (the e2e
// test checks the same table through `hetrain train`).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config.h"
#include "tests/unit/source_root.h"

using namespace ht::config;
namespace fs = std::filesystem;

namespace {

using ht::test_fixtures::source_root;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const char* kMinimal = R"({"model": {"type": "mlp"}, "data": {"dataset": "fashion_mnist"},
                           "train": {"steps": 10, "optimizer": {"lr": 0.01}}})";

}  // namespace

TEST_CASE("config: the shipped configs load") {
  const fs::path dir = source_root() / "configs";
  Config mlp = load_config((dir / "fashion_mnist_mlp.json").string());
  CHECK(mlp.name == "fashion_mnist_mlp");
  CHECK(mlp.run.dir == "runs/fashion_mnist_mlp");
  CHECK(mlp.model.type == "mlp");
  CHECK(mlp.model.hidden == std::vector<int64_t>{512, 512});
  CHECK(mlp.data.dataset == "fashion_mnist");
  CHECK(mlp.train.epochs == 8.0);
  CHECK(!mlp.train.steps);
  CHECK(mlp.train.optimizer.lr == 1e-3f);
  CHECK(mlp.train.schedule.type == "cosine");
  CHECK(mlp.train.schedule.warmup_steps == 100);
  CHECK(mlp.checkpoint.every == 1000);

  Config cnn = load_config((dir / "fashion_mnist_cnn.json").string());
  CHECK(cnn.model.channels == std::vector<int64_t>{32, 64});
  CHECK(cnn.model.fc_hidden == 128);
  CHECK(cnn.train.optimizer.lr == 2e-3f);

  Config gpt = load_config((dir / "text_gpt_tiny.json").string());
  CHECK(gpt.model.type == "gpt");
  CHECK(gpt.model.context == 128);
  CHECK(gpt.model.heads == 4);
  CHECK(gpt.data.paths == std::vector<std::string>{"/usr/share/games/fortunes"});
  CHECK(gpt.data.skip_suffixes == std::vector<std::string>{".dat", ".u8"});
  CHECK(gpt.train.steps == 3000);
  CHECK(gpt.train.optimizer.weight_decay == 0.01f);
  CHECK(gpt.train.grad_clip == 1.f);
  CHECK(gpt.train.eval_max_samples == 2048);
}

TEST_CASE("config: to_json round-trips and holds only the keys that apply") {
  std::vector<std::pair<std::string, std::string>> docs;
  for (const char* name : {"fashion_mnist_mlp", "fashion_mnist_cnn", "text_gpt_tiny"}) {
    const fs::path p = source_root() / "configs" / (std::string(name) + ".json");
    docs.emplace_back(read_text(p), p.string());
  }
  docs.emplace_back(R"({"model": {"type": "mlp", "hidden": []},
      "data": {"dataset": "fashion_mnist"},
      "train": {"epochs": 0.5, "seed": 18446744073709551615,
                "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": true}},
      "run": {"dir": "/tmp/x"}})",
                    "sgd.json");
  for (const auto& [text, path] : docs) {
    CAPTURE(path);
    const Config c = parse_config(text, path);
    const std::string once = to_json(c);
    const Config back = parse_config(once, path);
    CHECK(to_json(back) == once);
    CHECK(back.run.dir == c.run.dir);
    CHECK(back.train.optimizer.lr == c.train.optimizer.lr);
    CHECK(back.train.epochs == c.train.epochs);
    CHECK(back.train.seed == c.train.seed);
    const auto j = nlohmann::json::parse(once);
    CHECK(j["model"].contains("heads") == (c.model.type == "gpt"));
    CHECK(j["train"]["optimizer"].contains("momentum") == (c.train.optimizer.type == "sgd"));
    CHECK(j["train"]["optimizer"].contains("eps") == (c.train.optimizer.type == "adamw"));
    CHECK(j["data"].contains("paths") == (c.data.dataset == "text"));
    CHECK(j["train"].contains("steps") != j["train"].contains("epochs"));
  }
  // Floats print as their shortest exact decimal, not as widened doubles.
  const std::string gpt = to_json(parse_config(docs[2].first, docs[2].second));
  CHECK(gpt.find("\"lr\": 0.003") != std::string::npos);
  CHECK(gpt.find("\"weight_decay\": 0.01") != std::string::npos);
}

TEST_CASE("config: a device per world rank") {
  const std::string base = R"({"model": {"type": "mlp"}, "data": {"dataset": "fashion_mnist"},
      "train": {"steps": 10, "optimizer": {"lr": 0.001}}, )";
  const Config one = parse_config(base + R"("device": "auto"})", "one.json");
  CHECK(one.rank_devices.empty());
  CHECK(device_of_rank(one, 0, 1) == "auto");
  CHECK(device_of_rank(one, 2, 3) == "auto");  // one device: every rank's
  const Config mixed = parse_config(base + R"("device": ["cuda:0", "cpu", "auto"]})", "mixed.json");
  CHECK(mixed.rank_devices == std::vector<std::string>{"cuda:0", "cpu", "auto"});
  CHECK(device_of_rank(mixed, 0, 3) == "cuda:0");
  CHECK(device_of_rank(mixed, 1, 3) == "cpu");
  CHECK(device_of_rank(mixed, 2, 3) == "auto");
  CHECK_THROWS_WITH_AS(device_of_rank(mixed, 0, 2),
                       "device: a list of 3 devices for a job of 2 ranks; expected one per world rank, in rank "
                       "order, or one device (a string) for every rank",
                       ConfigError);
  CHECK_THROWS_WITH_AS(device_of_rank(parse_config(base + R"("device": ["cpu"]})", "l.json"), 0, 4),
                       doctest::Contains("a list of 1 device for a job of 4 ranks"), ConfigError);
  // The resolved config (a run directory's config.json) keeps the list.
  const auto j = nlohmann::json::parse(to_json(mixed));
  CHECK(j["device"] == nlohmann::json::array({"cuda:0", "cpu", "auto"}));
  CHECK(parse_config(to_json(mixed), "back.json").rank_devices == mixed.rank_devices);
  CHECK(nlohmann::json::parse(to_json(one))["device"] == "auto");
}

TEST_CASE("config: defaults are filled in") {
  const Config c = parse_config(kMinimal, "some/dir/minimal.json");
  CHECK(c.source_path == "some/dir/minimal.json");
  CHECK(c.name == "minimal");
  CHECK(c.run.dir == "runs/minimal");
  const ModelConfig m;
  CHECK(c.model.hidden == m.hidden);
  const DataConfig d;
  CHECK(c.data.dir == d.dir);
  CHECK(c.data.validation_fraction == d.validation_fraction);
  const TrainConfig t;
  CHECK(c.train.steps == 10);
  CHECK(!c.train.epochs);
  CHECK(c.train.batch_size == t.batch_size);
  CHECK(c.train.micro_batches == t.micro_batches);
  CHECK(c.train.seed == t.seed);
  CHECK(c.train.optimizer.type == "adamw");
  CHECK(c.train.optimizer.lr == 0.01f);
  CHECK(c.train.optimizer.beta1 == t.optimizer.beta1);
  CHECK(c.train.optimizer.beta2 == t.optimizer.beta2);
  CHECK(c.train.optimizer.eps == t.optimizer.eps);
  CHECK(c.train.optimizer.weight_decay == t.optimizer.weight_decay);
  CHECK(c.train.schedule.type == "constant");
  CHECK(c.train.grad_clip == t.grad_clip);
  CHECK(c.train.eval_every == t.eval_every);
  CHECK(c.train.eval_batch_size == t.eval_batch_size);
  CHECK(c.train.eval_max_samples == t.eval_max_samples);
  CHECK(c.train.log_every == t.log_every);
  const CheckpointConfig k;
  CHECK(c.checkpoint.every == k.every);
  CHECK(c.checkpoint.keep == k.keep);
  // An integral float is an integer (1e4 steps); the stem of an empty path is "config".
  const Config e = parse_config(R"({"model": {"type": "mlp"}, "data": {"dataset": "fashion_mnist"},
      "train": {"steps": 1e4, "optimizer": {"lr": 0.01}}})", "");
  CHECK(e.train.steps == 10000);
  CHECK(e.run.dir == "runs/config");
}

TEST_CASE("config: every bad config of the table fails with its one-line message") {
  const fs::path table = source_root() / "tests" / "e2e" / "bad_configs.json";
  const auto cases = nlohmann::json::parse(read_text(table));
  REQUIRE(cases.size() >= 35);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    CAPTURE(name);
    const std::string source = "bad/" + name + ".json";
    std::string message;
    try {
      if (c.contains("file")) {
        load_config(c["file"].get<std::string>());
      } else if (c.contains("text")) {
        parse_config(c["text"].get<std::string>(), source);
      } else {
        parse_config(c["config"].dump(), source);
      }
      FAIL_CHECK("accepted; expected a ConfigError");
      continue;
    } catch (const ConfigError& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.find('\n') == std::string::npos);
    for (const auto& want : c["expect"])
      CHECK(message.find(want.get<std::string>()) != std::string::npos);
    if (c.value("names_file", false)) CHECK(message.find(source) != std::string::npos);
  }
}
