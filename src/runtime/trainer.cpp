#include "runtime/trainer.h"

#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "autograd/graph.h"
#include "comm/communicator.h"
#include "core/threads.h"
#include "optim/lr_schedule.h"
#include "report/metrics_log.h"
#include "report/progress.h"
#include "runtime/checkpoint.h"
#include "runtime/atomic_file.h"
#include "runtime/checkpoint_dir.h"
#include "runtime/executor.h"
#include "runtime/run_dir.h"
#include "runtime/task.h"

namespace ht::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

// Ctrl-C stops at the next step boundary with a checkpoint instead of losing the run.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = 0;
    previous_ = std::signal(SIGINT, on_interrupt);
  }
  ~InterruptScope() { std::signal(SIGINT, previous_); }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  void (*previous_)(int);
};

int64_t resolve_steps(const config::TrainConfig& t, int64_t train_size) {
  if (t.steps) return *t.steps;
  double steps = std::ceil(*t.epochs * static_cast<double>(train_size) /
                           static_cast<double>(t.batch_size));
  return std::max<int64_t>(1, static_cast<int64_t>(steps));
}

// Names in checkpoints: "model.<param>" and "optim.<state>", so one file holds both
// and a reader can take the weights alone.
std::vector<nn::NamedTensor> prefixed(const std::string& prefix,
                                      const std::vector<nn::NamedTensor>& in) {
  std::vector<nn::NamedTensor> out;
  for (const auto& [name, t] : in) out.emplace_back(prefix + name, t);
  return out;
}

const std::string& metadata_text(const Checkpoint& c, const std::string& key) {
  auto it = c.metadata.find(key);
  HT_CHECK(it != c.metadata.end(), "checkpoint ", c.path, " lacks metadata '", key,
           "'; expected a checkpoint written by hetrain train");
  return it->second;
}

int64_t metadata_int(const Checkpoint& c, const std::string& key) {
  const std::string& text = metadata_text(c, key);
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  HT_CHECK(!text.empty() && *end == '\0', "checkpoint ", c.path, ": metadata '", key, "' is '",
           text, "'; expected an integer");
  return static_cast<int64_t>(v);
}

json eval_json(int64_t step, const EvalResult& r) {
  json j = {{"type", "eval"}, {"step", step}};
  for (const auto& [k, v] : r.metrics) j[k] = v;
  return j;
}

class Run {
 public:
  Run(config::Config cfg, const TrainOptions& opts)
      : cfg_(std::move(cfg)),
        opts_(opts),
        task_(make_task(cfg_)),
        dir_(RunDir::open(cfg_.run.dir, opts.resume)),
        model_(task_->build_model(cfg_.train.seed)),
        plan_(single_process_plan(static_cast<int>(model_.size()), cfg_.train.batch_size,
                                  static_cast<int>(cfg_.train.micro_batches))),
        executor_(plan_, model_, *task_, comm::world(), cfg_.train),
        checkpoints_(dir_.checkpoints(), cfg_.checkpoint.keep) {
    total_steps_ = resolve_steps(cfg_.train, task_->train_size());
    const auto& s = cfg_.train.schedule;
    schedule_ = {s.type, cfg_.train.optimizer.lr, s.warmup_steps, s.min_lr, total_steps_};
  }

  TrainSummary run() {
    report::Progress progress(report::Progress::detect(opts_.quiet), total_steps_,
                              cfg_.train.log_every);
    int64_t start = opts_.resume ? restore(progress) : 0;
    write_file_atomically(dir_.file("config.json"), config::to_json(cfg_) + "\n", "resolved config");
    report::MetricsLog metrics(dir_.file("metrics.jsonl"));
    if (opts_.resume) metrics.write(json{{"type", "resume"}, {"step", start}}.dump());
    if (start == 0)
      progress.note("training " + cfg_.name + ": " + std::to_string(total_steps_) + " steps of " +
                    std::to_string(cfg_.train.batch_size) + " samples, " +
                    std::to_string(model_.param_count()) + " parameters, run directory " +
                    dir_.path());

    InterruptScope interrupt_scope;
    auto t0 = Clock::now(), window_start = t0;
    int64_t window_steps = 0, step = start;
    double window_loss = 0;
    std::optional<EvalResult> last_eval;
    for (; step < total_steps_; ++step) {
      float lr = schedule_.at(step);
      double loss = train_step(step, lr);
      window_loss += loss;
      ++window_steps;
      int64_t done = step + 1;
      double elapsed = seconds_since(t0);
      double rate = static_cast<double>((done - start) * cfg_.train.batch_size) / elapsed;
      double eta = static_cast<double>(total_steps_ - done) * elapsed / (done - start);
      progress.step(done, static_cast<float>(loss), lr, rate, eta);
      if (done % cfg_.train.log_every == 0 || done == total_steps_) {
        double window = seconds_since(window_start);
        metrics.write(json{{"type", "train"},
                           {"step", done},
                           {"loss", window_loss / static_cast<double>(window_steps)},
                           {"lr", lr},
                           {"samples_per_s", window_steps * cfg_.train.batch_size / window},
                           {"wall_s", elapsed}}
                          .dump());
        window_loss = 0;
        window_steps = 0;
        window_start = Clock::now();
      }
      bool last = done == total_steps_;
      if (cfg_.train.eval_every > 0 && done % cfg_.train.eval_every == 0 && !last) {
        EvalResult r = evaluate();
        metrics.write(eval_json(done, r).dump());
        progress.note("step " + std::to_string(done) + ": " + r.line);
      }
      bool stop = g_interrupted || (opts_.stop_after && done - start >= *opts_.stop_after);
      if ((cfg_.checkpoint.every > 0 && done % cfg_.checkpoint.every == 0) || last || stop)
        save(done, progress);
      if (stop && !last) {
        progress.finish();
        if (g_interrupted)
          fail_as<Interrupted>("interrupted at step ", done, " of ", total_steps_,
                               "; a checkpoint was saved: continue with --resume");
        progress.note("stopped after " + std::to_string(done - start) + " steps at step " +
                      std::to_string(done) + "; continue with --resume");
        return {done, seconds_since(t0), dir_.path()};
      }
    }
    progress.finish();
    EvalResult final_eval = evaluate();
    metrics.write(eval_json(total_steps_, final_eval).dump());
    progress.note("final (step " + std::to_string(total_steps_) + "): " + final_eval.line);

    double wall = seconds_since(t0);
    json summary = {{"config", cfg_.name},
                    {"steps", total_steps_},
                    {"samples", total_steps_ * cfg_.train.batch_size},
                    {"steps_this_run", total_steps_ - start},
                    {"resumed_from_step", opts_.resume ? json(start) : json(nullptr)},
                    {"wall_s", wall},
                    {"mean_samples_per_s",
                     static_cast<double>((total_steps_ - start) * cfg_.train.batch_size) / wall},
                    {"final", json::object()}};
    for (const auto& [k, v] : final_eval.metrics) summary["final"][k] = v;
    write_file_atomically(dir_.file("summary.json"), summary.dump(2) + "\n", "summary");
    return {total_steps_, wall, dir_.path()};
  }

 private:
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }

  double train_step(int64_t step, float lr) {
    const auto& t = cfg_.train;
    const StepResult r = executor_.step(stream_base_ + step * t.batch_size, lr, false);
    double mean_loss =
        r.loss_sum / static_cast<double>(t.batch_size * task_->predictions_per_sample());
    HT_CHECK(std::isfinite(mean_loss), "training diverged at step ", step + 1, ": the loss is ",
             mean_loss, "; expected a finite value (lower train.optimizer.lr or set train.grad_clip)");
    return mean_loss;
  }

  EvalResult evaluate() {
    model_.set_training(false);
    EvalResult r;
    {
      NoGradGuard no_grad;
      r = task_->evaluate(model_);
    }
    model_.set_training(true);
    return r;
  }

  std::map<std::string, std::string> metadata(int64_t step) const {
    std::map<std::string, std::string> m = {
        {"hetrain.version", HETRAIN_VERSION},
        {"config", cfg_.name},
        {"model", cfg_.model.type},
        {"step", std::to_string(step)},
        {"total_steps", std::to_string(total_steps_)},
        {"seed", std::to_string(cfg_.train.seed)},
        // The data stream is a pure function of (seed, position): this is its state.
        {"sample_position", std::to_string(stream_base_ + step * cfg_.train.batch_size)}};
    for (size_t i = 0; i < model_.size(); ++i)
      if (uint64_t off = model_.block(i).random_offset())
        m["random_offset.block." + std::to_string(i)] = std::to_string(off);
    return m;
  }

  void save(int64_t step, report::Progress& progress) {
    std::vector<nn::NamedTensor> tensors = prefixed("model.", model_.named_parameters());
    for (auto& nt : prefixed("optim.", executor_.optimizer()->state())) tensors.push_back(nt);
    std::string path = checkpoints_.save(step, tensors, metadata(step));
    progress.note("checkpoint " + path);
  }

  // Loads the newest valid checkpoint into the model and optimiser; returns its step.
  int64_t restore(report::Progress& progress) {
    std::vector<std::string> skipped;
    auto loaded = checkpoints_.load_newest_valid(skipped);
    for (const std::string& s : skipped) progress.note("warning: " + s);
    if (!loaded) {
      progress.note("no checkpoint in " + dir_.checkpoints() + " to resume from; starting at step 0");
      return 0;
    }
    const auto& meta = loaded->metadata;
    auto get = [&](const std::string& key) { return metadata_text(*loaded, key); };
    auto get_int = [&](const std::string& key) { return metadata_int(*loaded, key); };
    HT_CHECK(get("model") == cfg_.model.type, "checkpoint ", loaded->path, " holds a ",
             get("model"), " model but the config builds a ", cfg_.model.type, " model");
    HT_CHECK(get("seed") == std::to_string(cfg_.train.seed), "checkpoint ", loaded->path,
             " was trained with seed ", get("seed"), " but the config (or --seed) says ",
             cfg_.train.seed, "; resuming with another seed would not continue the same run");
    load_into(prefixed("model.", model_.named_parameters()), *loaded, "model.");
    std::vector<nn::NamedTensor> state;
    for (const auto& [name, t] : loaded->tensors)
      if (name.rfind("optim.", 0) == 0) state.emplace_back(name.substr(6), t);
    executor_.optimizer()->load_state(state);
    for (size_t i = 0; i < model_.size(); ++i) {
      std::string key = "random_offset.block." + std::to_string(i);
      model_.block(i).set_random_offset(meta.count(key) ? static_cast<uint64_t>(get_int(key)) : 0);
    }
    int64_t step = get_int("step");
    // Continue the data stream where it stopped, even if train.batch_size changed.
    stream_base_ = get_int("sample_position") - step * cfg_.train.batch_size;
    HT_CHECK(step <= total_steps_, "checkpoint ", loaded->path, " is at step ", step,
             ", past the configured ", total_steps_, " steps; expected at most ", total_steps_,
             " (raise train.steps or --steps to train further)");
    progress.note("resuming " + cfg_.name + " from " + loaded->path + " at step " +
                  std::to_string(step) + " of " + std::to_string(total_steps_));
    return step;
  }

  config::Config cfg_;
  TrainOptions opts_;
  std::unique_ptr<Task> task_;  // loads the data first: a missing dataset creates no run dir
  RunDir dir_;
  nn::Sequential model_;
  plan::Plan plan_;
  Executor executor_;  // the whole model's optimiser lives here
  CheckpointDir checkpoints_;
  int64_t total_steps_ = 0;
  int64_t stream_base_ = 0;  // stream position of step 0's first sample
  optim::LrSchedule schedule_;
};

}  // namespace

void apply_overrides(config::Config& cfg, const TrainOptions& opts) {
  if (opts.steps) {
    HT_CHECK(*opts.steps >= 1, "--steps ", *opts.steps, " is out of range; expected at least 1");
    cfg.train.steps = *opts.steps;
    cfg.train.epochs.reset();
  }
  HT_CHECK(!opts.stop_after || *opts.stop_after >= 1, "--stop-after ", opts.stop_after.value_or(0),
           " is out of range; expected at least 1 step");
  if (opts.seed) cfg.train.seed = *opts.seed;
  if (opts.run_dir) cfg.run.dir = *opts.run_dir;
}

TrainSummary train(config::Config cfg, const TrainOptions& opts) {
  apply_overrides(cfg, opts);
  set_thread_count(resolve_thread_count());
  Run run(std::move(cfg), opts);
  return run.run();
}

std::string evaluate_checkpoint(const config::Config& cfg, const std::string& path) {
  set_thread_count(resolve_thread_count());
  Checkpoint ckpt = read_checkpoint(path);
  std::unique_ptr<Task> task = make_task(cfg);
  nn::Sequential model = task->build_model(cfg.train.seed);
  load_into(prefixed("model.", model.named_parameters()), ckpt, "model.");
  model.set_training(false);
  NoGradGuard no_grad;
  EvalResult r = task->evaluate(model);
  json out = {{"checkpoint", path}, {"config", cfg.name}};
  if (ckpt.metadata.count("step")) out["step"] = metadata_int(ckpt, "step");
  for (const auto& [k, v] : r.metrics) out[k] = v;
  std::fprintf(stderr, "%s: %s\n", path.c_str(), r.line.c_str());
  return out.dump();
}

}  // namespace ht::runtime
