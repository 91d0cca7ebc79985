// The held-out set shared out in chunks (runtime/trainer_evaluation.cpp: ranks holding the
// same weights each evaluate a part): any split of the chunks, its parts' sums
// concatenated in chunk order, gives one process's evaluation to the bit.
#include <doctest/doctest.h>

#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "runtime/task.h"
#include "tests/unit/source_root.h"

using namespace ht;
using ht::test_fixtures::source_root;

TEST_CASE("evaluation: chunks evaluated in parts add up to the whole evaluation, bit for bit" *
          doctest::test_suite("needs-fashion-mnist")) {
  config::Config cfg = config::load_config((source_root() / "configs/fashion_mnist_mlp.json").string());
  cfg.model.hidden = {32};
  cfg.train.eval_batch_size = 128;
  cfg.train.eval_max_samples = 1000;  // 7 chunks of 128 and one of 104
  const std::unique_ptr<runtime::Task> task = runtime::make_task(cfg, cpu_backend());
  nn::Sequential model = task->build_model(3);
  model.set_training(false);
  REQUIRE(task->eval_chunks() == 8);
  REQUIRE(task->eval_sums_per_chunk() == 3);
  const runtime::EvalResult whole = task->evaluate(model);
  for (const std::vector<int64_t>& cuts : std::vector<std::vector<int64_t>>{{0, 3, 3, 8}, {0, 1, 7, 8}, {0, 8}}) {
    std::vector<double> sums;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const std::vector<double> part = task->evaluate_chunks(model, cuts[k], cuts[k + 1]);
      CHECK(part.size() == static_cast<size_t>(cuts[k + 1] - cuts[k]) * 3);
      sums.insert(sums.end(), part.begin(), part.end());
    }
    const runtime::EvalResult shared = task->eval_result(sums);
    REQUIRE(shared.metrics.size() == whole.metrics.size());
    for (size_t m = 0; m < whole.metrics.size(); ++m) {
      CAPTURE(whole.metrics[m].first);
      CHECK(shared.metrics[m] == whole.metrics[m]);
    }
    CHECK(shared.line == whole.line);
  }
  // The last chunk is the short one, and none lies past it.
  const std::vector<double> last = task->evaluate_chunks(model, 7, 8);
  REQUIRE(last.size() == 3);
  CHECK(last[2] == 104);
  CHECK(task->evaluate_chunks(model, 8, 9).empty());
  CHECK(whole.metrics[2].second == 1000);  // test_samples
}
