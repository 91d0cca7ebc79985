// Config loading: every check happens here, before any work starts, and the first
// problem (in document order; within an object its "type"-like discriminator is read
// first, and checks that relate several keys run once the object is read) becomes one
// ConfigError line "<json path>: <value> <problem>; expected <what>".
//
// Required: the sections model, data and train; model.type; data.dataset;
// train.optimizer with its lr; exactly one of train.steps / train.epochs; data.paths
// when data.dataset is "text". Everything else defaults as in config.h.
#include "config/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>

#include "config/json_schema.h"
#include "core/crc32.h"
#include "core/device_request.h"
#include "core/enum_names.h"

namespace ht::config {

using namespace schema;

namespace {

const std::vector<std::string> kModelTypes{"mlp", "cnn", "gpt"};
const std::vector<std::string> kDatasets{"fashion_mnist", "text"};
const std::vector<std::string> kOptimizers{"adamw", "sgd"};
const std::vector<std::string> kSchedules{"constant", "cosine"};
// backend/precision.h's names (config/ sits below backend/; a unit case compares the lists).
const std::vector<std::string> kPrecisions{"fp32", "bf16", "fp16"};
const std::vector<std::string> kLossScaleModes{"auto", "dynamic", "none"};
constexpr int64_t kImageSide = 28;  // Fashion-MNIST; each cnn stage halves it

// Reads the discriminator `key` of obj first, so the walk can tell keys of another
// variant from unknown ones. Returns `fallback` when absent and fallback is non-empty.
std::string read_variant(const Json& obj, const std::string& path, const std::string& key,
                         const std::vector<std::string>& choices, const std::string& fallback) {
  auto it = obj.find(key);
  if (it != obj.end()) return read_enum(*it, key_path(path, key), choices);
  if (fallback.empty()) fail_missing(key_path(path, key), one_of(choices));
  return fallback;
}

// Table helpers: a key, the variants it applies to (none: all), where its value goes.
using Variants = std::vector<std::string>;
Field read_first(const char* key) {  // the discriminator, already read
  return {key, {}, [](const Json&, const std::string&) {}};
}
Field int_field(const char* key, Variants only, int64_t& dst, int64_t min) {
  return {key, std::move(only),
          [&dst, min](const Json& v, const std::string& p) { dst = read_int(v, p, min); }};
}
Field int_field(const char* key, Variants only, int64_t& dst, int64_t min, int64_t max) {
  return {key, std::move(only),
          [&dst, min, max](const Json& v, const std::string& p) { dst = read_int(v, p, min, max); }};
}
Field float_field(const char* key, Variants only, float& dst, Range r) {
  return {key, std::move(only),
          [&dst, r](const Json& v, const std::string& p) { dst = read_float(v, p, r); }};
}

// A nested object, read by its own function.
template <class T>
Field section(const char* key, void (*read)(const Json&, const std::string&, T&), T& dst) {
  return {key, {}, [read, &dst](const Json& v, const std::string& p) { read(v, p, dst); }};
}

std::string divisor_error(int64_t part, const std::string& whole_path, int64_t whole) {
  return std::to_string(part) + " does not divide " + whole_path + " " + std::to_string(whole) +
         "; expected a divisor of " + std::to_string(whole);
}

void read_model(const Json& j, const std::string& path, ModelConfig& m) {
  expect_object(j, path, "an object with \"type\" (mlp, cnn or gpt) and its sizes");
  m.type = read_variant(j, path, "type", kModelTypes, "");
  auto read_channels = [&](const Json& v, const std::string& p) {
    m.channels = read_int_array(v, p, 1);
    // Each stage pools the image side in half and needs a side >= 2: 28, 14, 7, 3.
    size_t stages = 0;
    for (int64_t side = kImageSide; side >= 2; side /= 2) ++stages;
    if (m.channels.size() > stages)
      fail_at(p, show(v) + " has " + std::to_string(m.channels.size()) +
                     " conv stages; expected at most " + std::to_string(stages) +
                     " (each halves the 28x28 image)");
  };
  walk(j, path,
       {read_first("type"),
        {"hidden", {"mlp"}, [&](const Json& v, const std::string& p) {
           m.hidden = read_int_array(v, p, 1);
         }},
        {"channels", {"cnn"}, read_channels},
        int_field("fc_hidden", {"cnn"}, m.fc_hidden, 1),
        int_field("context", {"gpt"}, m.context, 1),
        int_field("layers", {"gpt"}, m.layers, 1),
        int_field("heads", {"gpt"}, m.heads, 1),
        int_field("d_model", {"gpt"}, m.d_model, 1),
        float_field("dropout", {"gpt"}, m.dropout, Range::closed_open(0, 1))},
       key_path(path, "type"), m.type);
  if (m.type == "gpt" && m.d_model % m.heads != 0)
    fail_at(key_path(path, "heads"), divisor_error(m.heads, key_path(path, "d_model"), m.d_model));
}

void read_data(const Json& j, const std::string& path, DataConfig& d) {
  expect_object(j, path, "an object with \"dataset\" (fashion_mnist or text)");
  d.dataset = read_variant(j, path, "dataset", kDatasets, "");
  walk(j, path,
       {read_first("dataset"),
        {"dir", {"fashion_mnist"}, [&](const Json& v, const std::string& p) {
           d.dir = read_string(v, p, "a directory holding the Fashion-MNIST IDX files");
         }},
        {"paths", {"text"}, [&](const Json& v, const std::string& p) {
           d.paths = read_string_array(v, p, "file or directory paths");
           if (d.paths.empty()) fail_at(p, "[] is empty; expected at least one file or directory");
         }},
        {"skip_suffixes", {"text"}, [&](const Json& v, const std::string& p) {
           d.skip_suffixes = read_string_array(v, p, "file name suffixes such as \".dat\"");
         }},
        {"validation_fraction", {"text"}, [&](const Json& v, const std::string& p) {
           d.validation_fraction = read_double(v, p, Range::open(0, 1));
         }}},
       key_path(path, "dataset"), d.dataset);
  if (d.dataset == "text" && !j.contains("paths"))
    fail_missing(key_path(path, "paths"),
                 "a non-empty array of files or directories (required for dataset \"text\")");
}

void read_optimizer(const Json& j, const std::string& path, OptimizerConfig& o) {
  expect_object(j, path, "an object with \"lr\" (and \"type\": adamw or sgd)");
  o.type = read_variant(j, path, "type", kOptimizers, "adamw");
  const Range beta = Range::closed_open(0, 1);
  walk(j, path,
       {read_first("type"),
        float_field("lr", {}, o.lr, Range::above(0)),
        float_field("beta1", {"adamw"}, o.beta1, beta),
        float_field("beta2", {"adamw"}, o.beta2, beta),
        float_field("eps", {"adamw"}, o.eps, Range::above(0)),
        // Below 1: at 1 the velocity never decays, and above it grows without bound.
        float_field("momentum", {"sgd"}, o.momentum, Range::closed_open(0, 1)),
        {"nesterov", {"sgd"}, [&](const Json& v, const std::string& p) {
           o.nesterov = read_bool(v, p);
         }},
        float_field("weight_decay", {}, o.weight_decay, Range::at_least(0))},
       key_path(path, "type"), o.type);
  if (!j.contains("lr")) fail_missing(key_path(path, "lr"), "a number > 0 (the learning rate)");
  // Each step scales the weights by (1 - lr x weight_decay), AdamW's decoupled decay and
  // SGD's alike: at lr x weight_decay >= 1 that zeroes or flips them (1e30 trained a run
  // of non-finite steps to exit 0).
  if (const double decay = static_cast<double>(o.lr) * o.weight_decay; decay >= 1) {
    char factor[32];
    std::snprintf(factor, sizeof factor, "%.3g", 1 - decay);
    fail_at(key_path(path, "weight_decay"), show(float_json(o.weight_decay)) + " with lr " + show(float_json(o.lr)) +
                                                " scales the weights by 1 - lr x weight_decay = " + factor +
                                                " each step; expected lr x weight_decay below 1");
  }
  // Nesterov looks ahead along the momentum; without momentum it silently does nothing.
  if (o.nesterov && o.momentum <= 0)
    fail_at(key_path(path, "nesterov"), "true needs momentum; expected " +
                                            key_path(path, "momentum") + " > 0 (it is " +
                                            show(float_json(o.momentum)) + ") or nesterov false");
}

void read_schedule(const Json& j, const std::string& path, ScheduleConfig& s) {
  expect_object(j, path, "an object with \"type\" (constant or cosine)");
  s.type = read_variant(j, path, "type", kSchedules, "constant");
  walk(j, path,
       {read_first("type"),
        int_field("warmup_steps", {"cosine"}, s.warmup_steps, 0),
        float_field("min_lr", {"cosine"}, s.min_lr, Range::at_least(0))},
       key_path(path, "type"), s.type);
}

void read_loss_scale(const Json& j, const std::string& path, LossScaleSettings& l) {
  expect_object(j, path, "an object with \"mode\" (auto, dynamic or none) and its settings");
  // Powers of two, so that scaling a gradient and unscaling it again is exact.
  // From 2^-64 to 2^64: a float's range holds a loss and its gradients scaled by it (2^200
  // is inf as a float, and a run whose every step overflowed exited 0).
  auto power_of_two = [](const char* key, double& dst) -> Field {
    return {key, {}, [&dst](const Json& v, const std::string& p) {
              dst = read_double(v, p, Range::above(0));
              int e = 0;
              if (std::frexp(dst, &e) != 0.5 || !std::isfinite(dst))
                fail_at(p, show(v) + " is not a power of two; expected one, such as 65536 (2^16), so that "
                                     "scaling by it is exact");
              if (e - 1 < -LossScaleSettings::kMaxLog2 || e - 1 > LossScaleSettings::kMaxLog2)
                fail_at(p, show(v) + " is 2^" + std::to_string(e - 1) + "; expected a power of two from 2^-" +
                               std::to_string(LossScaleSettings::kMaxLog2) + " to 2^" +
                               std::to_string(LossScaleSettings::kMaxLog2));
            }};
  };
  walk(j, path,
       {{"mode", {}, [&](const Json& v, const std::string& p) { l.mode = read_enum(v, p, kLossScaleModes); }},
        power_of_two("initial", l.initial), int_field("growth_interval", {}, l.growth_interval, 1),
        power_of_two("min", l.min), power_of_two("max", l.max)});
  auto num = [](double x) {  // powers of two: whole ones as integers
    return x >= 1 && x < 1e15 ? std::to_string(static_cast<int64_t>(x)) : show(Json(x));
  };
  if (l.min > l.max)
    fail_at(key_path(path, "min"), num(l.min) + " is above " + key_path(path, "max") + " " + num(l.max) +
                                       "; expected min <= initial <= max");
  if (l.initial < l.min || l.initial > l.max)
    fail_at(key_path(path, "initial"), num(l.initial) + " is outside [" + num(l.min) + ", " + num(l.max) +
                                           "] (min, max); expected min <= initial <= max");
}

void read_train(const Json& j, const std::string& path, TrainConfig& t) {
  expect_object(j, path, "an object with \"optimizer\" and \"steps\" or \"epochs\"");
  walk(j, path,
       {{"steps", {}, [&](const Json& v, const std::string& p) {
          t.steps = read_int(v, p, 1);
          // The checkpoint keeps the optimiser's step count as an int32.
          if (t.steps > TrainConfig::kMaxSteps)
            fail_at(p, std::to_string(*t.steps) + " is out of range; expected at most " +
                           std::to_string(TrainConfig::kMaxSteps) + " (2^31 - 1: the checkpoint's step counter)");
        }},
        {"epochs", {}, [&](const Json& v, const std::string& p) {
           t.epochs = read_double(v, p, Range::above(0));
         }},
        int_field("batch_size", {}, t.batch_size, 1),
        int_field("micro_batches", {}, t.micro_batches, 1),
        {"seed", {}, [&](const Json& v, const std::string& p) { t.seed = read_uint(v, p); }},
        section("optimizer", read_optimizer, t.optimizer),
        section("schedule", read_schedule, t.schedule),
        float_field("grad_clip", {}, t.grad_clip, Range::at_least(0)),
        int_field("eval_every", {}, t.eval_every, 0),
        int_field("eval_batch_size", {}, t.eval_batch_size, 1),
        int_field("eval_max_samples", {}, t.eval_max_samples, 0),
        int_field("log_every", {}, t.log_every, 1),
        {"precision", {}, [&](const Json& v, const std::string& p) {
           t.precision = read_enum(v, p, kPrecisions);
         }},
        section("loss_scale", read_loss_scale, t.loss_scale)});
  if (!j.contains("optimizer"))
    fail_missing(key_path(path, "optimizer"),
                 "an object with \"lr\", e.g. {\"type\": \"adamw\", \"lr\": 0.001}");
  if (t.steps && t.epochs)
    fail_at(key_path(path, "epochs"), show(Json(*t.epochs)) + " is given together with " +
                                          key_path(path, "steps") +
                                          "; expected exactly one of steps, epochs");
  if (!t.steps && !t.epochs)
    fail_missing(key_path(path, "steps"),
                 "exactly one of steps (an integer >= 1) or epochs (a number > 0)");
  if (t.precision == "fp16" && t.loss_scale.mode == "none")
    fail_at(key_path(path, "loss_scale") + ".mode",
            "\"none\" under precision \"fp16\" would flush small gradients to zero (fp16's smallest normal is "
            "2^-14); expected \"auto\" or \"dynamic\"");
  // Far past any real step: a batch of 2^31 samples once held the planner for minutes.
  constexpr int64_t kMaxBatch = int64_t{1} << 24;
  if (t.batch_size > kMaxBatch)
    fail_at(key_path(path, "batch_size"), std::to_string(t.batch_size) + " samples; expected at most " +
                                              std::to_string(kMaxBatch) + " (2^24) a step");
  // plan::kMaxMicroBatches: the most a replica's step runs.
  constexpr int64_t kMaxMicroBatches = int64_t{1} << 16;
  if (t.micro_batches > kMaxMicroBatches)
    fail_at(key_path(path, "micro_batches"), std::to_string(t.micro_batches) + "; expected at most " +
                                                 std::to_string(kMaxMicroBatches) + " (2^16) a step");
  if (t.batch_size % t.micro_batches != 0)
    fail_at(key_path(path, "micro_batches"),
            divisor_error(t.micro_batches, key_path(path, "batch_size"), t.batch_size));
  // A cosine floor above the peak would make the "decay" climb.
  if (t.schedule.type == "cosine" && t.schedule.min_lr > t.optimizer.lr)
    fail_at(path + ".schedule.min_lr",
            show(float_json(t.schedule.min_lr)) + " is above " + path + ".optimizer.lr " +
                show(float_json(t.optimizer.lr)) + "; expected a number in [0, lr]");
}

void read_checkpoint(const Json& j, const std::string& path, CheckpointConfig& c) {
  expect_object(j, path, "an object with \"every\" and \"keep\"");
  walk(j, path, {int_field("every", {}, c.every, 0), int_field("keep", {}, c.keep, 1)});
}

void read_parallel(const Json& j, const std::string& path, ParallelConfig& c) {
  expect_object(j, path, "an object with \"strategy\", \"sync\" and their settings");
  auto number = [](const char* key, double& dst, Range r) -> Field {
    return {key, {}, [&dst, r](const Json& v, const std::string& p) { dst = read_double(v, p, r); }};
  };
  walk(j, path, {{"strategy", {}, [&](const Json& v, const std::string& p) {
                    c.strategy = *parse_parallel_strategy(read_enum(v, p, parallel_strategy_names()));
                  }},
                 int_field("rebalance_every", {}, c.rebalance_every, 0),
                 {"sync", {}, [&](const Json& v, const std::string& p) {
                    c.sync = *parse_sync_policy(read_enum(v, p, sync_policy_names()));
                  }},
                 // At most a week: past a year the waits' deadlines were dropped as none,
                 // and past 1e10 s the conversion to clock ticks overflows.
                 number("peer_timeout_s", c.peer_timeout_s, Range{0, ParallelConfig::kMaxPeerTimeoutS, true, false}),
                 // At most 1e4 (the tests take 1e3: a step closes when every rank is in): past
                 // 1e12 or so the budget overflowed and every step closed short at once.
                 number("deadline_slack", c.deadline_slack, Range{0, 1e4}),
                 // Counts of steps a plan holds in 32 bits (a round's H and D) or adds to a
                 // step: 2^32 + 4 was taken as H 4, silently.
                 int_field("max_staleness", {}, c.max_staleness, 0, kMaxStepCount),
                 int_field("local_steps", {}, c.local_steps, 0, kMaxStepCount),
                 int_field("outer_delay", {}, c.outer_delay, 0, kMaxStepCount),
                 number("outer_lr", c.outer_lr, Range::above(0)),
                 number("outer_momentum", c.outer_momentum, Range::closed_open(0, 1))});
  // A setting of another policy than the one asked for would do nothing, silently; a
  // default value is no setting (a resolved config.json holds every field).
  if (c.sync) {
    const ParallelConfig defaults;
    const auto unused = [&](const char* key, bool is_default, const char* policy) {
      if (j.contains(key) && !is_default)
        fail_at(key_path(path, key), show(j[key]) + " is a setting of parallel.sync \"" + policy + "\", which is \"" +
                                         to_string(*c.sync) + "\" here; expected it only with \"" + policy + "\"" +
                                         (std::string(policy) == "local"
                                              ? " (or sync not given, where the planner may choose it)"
                                              : ""));
    };
    if (*c.sync != SyncPolicy::local) {
      unused("local_steps", c.local_steps == defaults.local_steps, "local");
      unused("outer_delay", c.outer_delay == defaults.outer_delay, "local");
      unused("outer_lr", c.outer_lr == defaults.outer_lr, "local");
      unused("outer_momentum", c.outer_momentum == defaults.outer_momentum, "local");
    }
    if (*c.sync != SyncPolicy::deadline) {
      unused("deadline_slack", c.deadline_slack == defaults.deadline_slack, "deadline");
      unused("max_staleness", c.max_staleness == defaults.max_staleness, "deadline");
    }
  }
  // The outer step of a round lands within the next round (plan/local_plan.h).
  if (c.local_steps > 0 && c.outer_delay > c.local_steps)
    fail_at(key_path(path, "outer_delay"), std::to_string(c.outer_delay) + " is above parallel.local_steps " +
                                               std::to_string(c.local_steps) +
                                               "; expected at most H, the round's steps (0: at the round's end)");
  // Local groups are data-parallel replicas of the whole model: no pipeline, no equal split.
  if (c.sync == SyncPolicy::local && c.strategy != ParallelStrategy::automatic && c.strategy != ParallelStrategy::data)
    fail_at(key_path(path, "sync"), "\"local\" with strategy \"" + std::string(to_string(c.strategy)) +
                                         "\"; expected strategy \"auto\" or \"data\" (local groups replicate the whole model)");
}

void read_guard(const Json& j, const std::string& path, GuardConfig& g) {
  expect_object(j, path, "an object with \"norm_ratio\", \"window\", \"quarantine_after\" and \"quarantine_steps\"");
  walk(j, path, {{"norm_ratio", {}, [&](const Json& v, const std::string& p) {
                    g.norm_ratio = read_double(v, p, Range::at_least(0));
                    if (g.norm_ratio > 0 && g.norm_ratio <= 1)
                      fail_at(p, show(v) + " would leave out ordinary steps; expected 0 (no norm check) or a ratio above 1");
                  }},
                 int_field("window", {}, g.window, 2, kMaxStepCount),
                 int_field("quarantine_after", {}, g.quarantine_after, 1, kMaxStepCount),
                 // Added to a step: 2^63 - 1 wrapped, and the quarantine never held.
                 int_field("quarantine_steps", {}, g.quarantine_steps, 1, kMaxStepCount)});
  // Offences are counted over the last `window` steps, at most one a step.
  if (g.quarantine_after > g.window)
    fail_at(key_path(path, "quarantine_after"), std::to_string(g.quarantine_after) + " offences within a window of " +
                                                    std::to_string(g.window) +
                                                    " steps (guard.window) can never happen; expected at most the window");
}

void read_run(const Json& j, const std::string& path, RunConfig& r) {
  expect_object(j, path, "an object with \"dir\"");
  walk(j, path, {{"dir", {}, [&](const Json& v, const std::string& p) {
                    r.dir = read_string(v, p, "a non-empty directory path");
                  }}});
}

void read_emulate(const Json& j, const std::string& path, EmulateConfig& e) {
  expect_object(j, path, "an object with \"ranks\": [{\"rank\": 1, \"latency_ms\": 20}, ...]");
  walk(j, path, {{"ranks", {}, [&](const Json& v, const std::string& p) {
                    if (!v.is_array())
                      fail_at(p, show(v) + " is not an array; expected one object per emulated rank");
                    for (size_t i = 0; i < v.size(); ++i) {
                      const std::string ip = index_path(p, i);
                      RankEmulation r;
                      bool has_rank = false;
                      expect_object(v[i], ip, "an object with \"rank\" and what to emulate");
                      walk(v[i], ip,
                           {{"rank", {}, [&](const Json& x, const std::string& xp) {
                               r.rank = read_int(x, xp, 0);
                               has_rank = true;
                             }},
                            // Bounded as the what-if's link events are: past them the
                            // delay's conversion to clock ticks overflowed, and 1e13 ms or
                            // 1e-300 MB/s emulated no delay at all.
                            {"latency_ms", {}, [&](const Json& x, const std::string& xp) {
                               r.latency_ms = read_double(x, xp, Range{0, RankEmulation::kMaxLatencyMs});
                             }},
                            {"bandwidth_mb_s", {}, [&](const Json& x, const std::string& xp) {
                               r.bandwidth_mb_s = read_double(x, xp, Range{0, RankEmulation::kMaxBandwidthMbS});
                               if (r.bandwidth_mb_s > 0 && r.bandwidth_mb_s < RankEmulation::kMinBandwidthMbS)
                                 fail_at(xp, show(x) + " is above 0 but below 1e-6; expected 0 (no limit) or a "
                                                 "bandwidth in MB/s from 1e-6 (a byte a second) to 1e9");
                             }},
                            int_field("memory_cap_mb", {}, r.memory_cap_mb, 0)});
                      if (!has_rank) fail_missing(key_path(ip, "rank"), "the rank this entry emulates");
                      for (const RankEmulation& other : e.ranks)
                        if (other.rank == r.rank)
                          fail_at(key_path(ip, "rank"), std::to_string(r.rank) +
                                                             " appears twice; expected one entry per rank");
                      e.ranks.push_back(r);
                    }
                  }}});
}

}  // namespace

namespace {
constexpr EnumName<ParallelStrategy> kParallelStrategyNames[] = {
    {ParallelStrategy::automatic, "auto"},
    {ParallelStrategy::data, "data"},
    {ParallelStrategy::pipeline, "pipeline"},
    {ParallelStrategy::equal, "equal"}};
}  // namespace

const char* to_string(ParallelStrategy s) { return enum_name(s, kParallelStrategyNames); }
std::vector<std::string> parallel_strategy_names() { return enum_names(kParallelStrategyNames); }
std::optional<ParallelStrategy> parse_parallel_strategy(std::string_view s) {
  return enum_from_name(s, kParallelStrategyNames);
}

namespace {
constexpr EnumName<SyncPolicy> kSyncPolicyNames[] = {
    {SyncPolicy::sync, "sync"}, {SyncPolicy::deadline, "deadline"}, {SyncPolicy::local, "local"}};
}  // namespace

const char* to_string(SyncPolicy s) { return enum_name(s, kSyncPolicyNames); }
std::vector<std::string> sync_policy_names() { return enum_names(kSyncPolicyNames); }
std::optional<SyncPolicy> parse_sync_policy(std::string_view s) { return enum_from_name(s, kSyncPolicyNames); }

std::string device_of_rank(const Config& c, int rank, int world_size) {
  if (c.rank_devices.empty()) return c.device;
  if (static_cast<int>(c.rank_devices.size()) != world_size)
    throw ConfigError("device: a list of " + std::to_string(c.rank_devices.size()) + " device" +
                      (c.rank_devices.size() == 1 ? "" : "s") + " for a job of " + std::to_string(world_size) +
                      " rank" + (world_size == 1 ? "" : "s") +
                      "; expected one per world rank, in rank order, or one device (a string) for every rank");
  HT_CHECK(rank >= 0 && rank < world_size, "device_of_rank: rank ", rank, " of ", world_size);
  return c.rank_devices[static_cast<size_t>(rank)];
}

Config parse_config(const std::string& json_text, const std::string& source_path) {
  const std::string source = source_path.empty() ? "<config>" : source_path;
  const Json doc = parse_document(json_text, source);
  Config c;
  c.source_path = source_path;
  c.name = std::filesystem::path(source_path).stem().string();
  if (c.name.empty()) c.name = "config";
  // The name goes into JSON and the checkpoints' header, which hold UTF-8 text only: a
  // file name of other bytes keeps its valid part, each invalid byte replaced by U+FFFD
  // (else the first checkpoint of a whole run would fail).
  c.name = Json::parse(Json(c.name).dump(-1, ' ', false, Json::error_handler_t::replace)).get<std::string>();
  expect_object(doc, "(top level)", "an object with sections model, data, train");
  // "device" is a top-level string (or a list, one per world rank), not a section: it says
  // where the run computes.
  walk(doc, "",
       {{"description", {}, [](const Json& v, const std::string& p) {
           if (!v.is_string()) fail_at(p, show(v) + " is not a string; expected free text");
         }},
        section("model", read_model, c.model),
        section("data", read_data, c.data),
        section("train", read_train, c.train),
        section("checkpoint", read_checkpoint, c.checkpoint),
        section("parallel", read_parallel, c.parallel),
        section("guard", read_guard, c.guard),
        section("run", read_run, c.run),
        section("emulate", read_emulate, c.emulate),
        {"device", {}, [&](const Json& v, const std::string& p) {
           if (v.is_array()) {  // one per world rank
             if (v.empty())
               fail_at(p, "[] is an empty list; expected one device per world rank, such as [\"cuda\", \"cpu\"], "
                          "or one device for every rank");
             for (size_t i = 0; i < v.size(); ++i) {
               const std::string d = v[i].is_string() ? v[i].get<std::string>() : std::string();
               if (!v[i].is_string() || !try_parse_device(d))
                 fail_at(index_path(p, i), show(v[i]) + " is not a device; expected " + kDeviceForms);
               c.rank_devices.push_back(d);
             }
             return;
           }
           const std::string d = v.is_string() ? v.get<std::string>() : std::string();
           if (!v.is_string() || !try_parse_device(d))
             fail_at(p, show(v) + " is not a device; expected " + kDeviceForms);
           c.device = d;
         }}});
  if (!doc.contains("model"))
    fail_missing("model", "a section like {\"type\": \"mlp\"} (mlp, cnn or gpt)");
  if (!doc.contains("data"))
    fail_missing("data", "a section like {\"dataset\": \"fashion_mnist\"} (fashion_mnist or text)");
  if (!doc.contains("train"))
    fail_missing("train", "a section with \"optimizer\" {\"lr\": ...} and \"steps\" or \"epochs\"");
  // The classifiers read 28x28 images; the language model reads bytes.
  const std::string wanted = c.model.type == "gpt" ? "text" : "fashion_mnist";
  if (c.data.dataset != wanted)
    fail_at("data.dataset", show(Json(c.data.dataset)) + " does not suit model.type \"" +
                                c.model.type + "\"; expected \"" + wanted + "\"");
  // The replicas agree on an overflow through the verdicts of one stage group's
  // reduction (runtime/executor_sync.cpp; under deadline, the verdicts in each step's
  // record): a pipeline's stages would need one more message a step. Not built.
  if (dynamic_loss_scale(c.train)) {
    const std::string why = c.train.precision == "fp16" ? "precision \"fp16\" (whose loss scale is dynamic)"
                                                        : "train.loss_scale.mode \"dynamic\"";
    if (c.parallel.strategy == ParallelStrategy::pipeline)
      fail_at("parallel.strategy", "\"pipeline\" with " + why +
                                       " is not built; expected strategy \"auto\" or \"data\" (auto then plans "
                                       "data-parallel replicas of the whole model)");
  }
  // Under local the trainer leaves out the guard's norm check (an outer step moves a
  // group's weights by a round's progress, so the next gradients' norms are no outliers):
  // a ratio asked for would do nothing, silently. Its default is no setting.
  if (c.parallel.sync == SyncPolicy::local && doc.contains("guard") && doc["guard"].contains("norm_ratio") &&
      c.guard.norm_ratio != GuardConfig{}.norm_ratio && c.guard.norm_ratio != 0)
    fail_at("guard.norm_ratio", show(doc["guard"]["norm_ratio"]) +
                                    " is a setting of the norm check, which parallel.sync \"local\" leaves out (an "
                                    "outer step moves a group's weights by a whole round's progress); expected it "
                                    "only with \"sync\" or \"deadline\" (the non-finite check runs under every policy)");
  if (c.run.dir.empty()) c.run.dir = "runs/" + c.name;
  return c;
}

bool dynamic_loss_scale(const TrainConfig& t) {
  return t.loss_scale.mode == "dynamic" || (t.loss_scale.mode == "auto" && t.precision == "fp16");
}

int64_t eval_batch(const TrainConfig& t) {
  return t.eval_max_samples > 0 ? std::min(t.eval_batch_size, t.eval_max_samples) : t.eval_batch_size;
}

Config load_config(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    throw ConfigError(path + ": no such config file; expected a readable JSON file");
  // A config is a few hundred bytes; a huge file is a wrong path (a dataset, say).
  constexpr uintmax_t kMaxBytes = 1 << 20;
  if (fs::is_regular_file(st) && fs::file_size(path, ec) > kMaxBytes)
    throw ConfigError(path + ": " + std::to_string(fs::file_size(path, ec)) +
                      " bytes is too large for a config; expected at most 1 MiB");
  // A directory, a pipe or a failed read, as every JSON file hetrain reads.
  return parse_config(schema::read_document_file(path, "a JSON config file"), path);
}

std::string to_json(const Config& c) {
  Json model{{"type", c.model.type}};
  if (c.model.type == "mlp") {
    model["hidden"] = c.model.hidden;
  } else if (c.model.type == "cnn") {
    model["channels"] = c.model.channels;
    model["fc_hidden"] = c.model.fc_hidden;
  } else {
    model["context"] = c.model.context;
    model["layers"] = c.model.layers;
    model["heads"] = c.model.heads;
    model["d_model"] = c.model.d_model;
    model["dropout"] = float_json(c.model.dropout);
  }
  Json data{{"dataset", c.data.dataset}};
  if (c.data.dataset == "fashion_mnist") {
    data["dir"] = c.data.dir;
  } else {
    data["paths"] = c.data.paths;
    data["skip_suffixes"] = c.data.skip_suffixes;
    data["validation_fraction"] = c.data.validation_fraction;
  }
  const OptimizerConfig& o = c.train.optimizer;
  Json opt{{"type", o.type}, {"lr", float_json(o.lr)}};
  if (o.type == "adamw") {
    opt["beta1"] = float_json(o.beta1);
    opt["beta2"] = float_json(o.beta2);
    opt["eps"] = float_json(o.eps);
  } else {
    opt["momentum"] = float_json(o.momentum);
    opt["nesterov"] = o.nesterov;
  }
  opt["weight_decay"] = float_json(o.weight_decay);
  const ScheduleConfig& s = c.train.schedule;
  Json sched{{"type", s.type}};
  if (s.type == "cosine") {
    sched["warmup_steps"] = s.warmup_steps;
    sched["min_lr"] = float_json(s.min_lr);
  }
  Json train = Json::object();
  if (c.train.steps) train["steps"] = *c.train.steps;
  if (c.train.epochs) train["epochs"] = *c.train.epochs;
  train["batch_size"] = c.train.batch_size;
  train["micro_batches"] = c.train.micro_batches;
  train["seed"] = c.train.seed;
  train["optimizer"] = opt;
  train["schedule"] = sched;
  train["grad_clip"] = float_json(c.train.grad_clip);
  train["eval_every"] = c.train.eval_every;
  train["eval_batch_size"] = c.train.eval_batch_size;
  train["eval_max_samples"] = c.train.eval_max_samples;
  train["log_every"] = c.train.log_every;
  train["precision"] = c.train.precision;
  train["loss_scale"] = {{"mode", c.train.loss_scale.mode},
                         {"initial", c.train.loss_scale.initial},
                         {"growth_interval", c.train.loss_scale.growth_interval},
                         {"min", c.train.loss_scale.min},
                         {"max", c.train.loss_scale.max}};
  Json doc{{"model", model},
           {"data", data},
           {"train", train},
           {"checkpoint", {{"every", c.checkpoint.every}, {"keep", c.checkpoint.keep}}},
           {"parallel",
            {{"strategy", to_string(c.parallel.strategy)},
             {"rebalance_every", c.parallel.rebalance_every},
             {"peer_timeout_s", c.parallel.peer_timeout_s},
             {"deadline_slack", c.parallel.deadline_slack},
             {"max_staleness", c.parallel.max_staleness},
             {"local_steps", c.parallel.local_steps},
             {"outer_delay", c.parallel.outer_delay},
             {"outer_lr", c.parallel.outer_lr},
             {"outer_momentum", c.parallel.outer_momentum}}},
           {"guard",
            {{"norm_ratio", c.guard.norm_ratio},
             {"window", c.guard.window},
             {"quarantine_after", c.guard.quarantine_after},
             {"quarantine_steps", c.guard.quarantine_steps}}},
           {"run", {{"dir", c.run.dir}}},
           {"device", c.rank_devices.empty() ? Json(c.device) : Json(c.rank_devices)}};
  if (c.parallel.sync) doc["parallel"]["sync"] = to_string(*c.parallel.sync);  // absent: the planner's choice
  if (!c.emulate.ranks.empty()) {
    Json ranks = Json::array();
    for (const RankEmulation& r : c.emulate.ranks)
      ranks.push_back({{"rank", r.rank},
                       {"latency_ms", r.latency_ms},
                       {"bandwidth_mb_s", r.bandwidth_mb_s},
                       {"memory_cap_mb", r.memory_cap_mb}});
    doc["emulate"] = {{"ranks", ranks}};
  }
  return doc.dump(2) + "\n";
}

namespace {

std::string crc_hex(const std::string& text) {
  return crc32_hex(crc32_update(0, text.data(), text.size()));
}

}  // namespace

std::string config_hash(const Config& c) {
  Config same = c;
  same.run.dir.clear();  // where rank 0 writes is not part of what is trained
  return crc_hex(to_json(same));
}

std::string plan_hash(const Config& c) {
  const Json all = Json::parse(to_json(c));
  const Json& train = all["train"];
  const Json planned = {{"model", all["model"]},
                        {"dataset", all["data"]["dataset"]},
                        {"batch_size", train["batch_size"]},
                        {"micro_batches", train["micro_batches"]},
                        {"optimizer", train["optimizer"]["type"]},
                        {"momentum", train["optimizer"].value("momentum", Json(0))},
                        {"strategy", all["parallel"]["strategy"]},
                        {"sync", all["parallel"].value("sync", Json(nullptr))}};
  return crc_hex(planned.dump());
}

}  // namespace ht::config
