// The run's checkpoints: their metadata (what a resume and a reader outside hetrain need),
// the collective save of the whole model, the resume from the newest valid one, and the
// evaluation of one checkpoint on its own.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/graph.h"
#include "backend/registry.h"
#include "core/threads.h"
#include "data/image_dataset.h"
#include "plan/plan_json.h"
#include "plan/resumed_shares.h"
#include "runtime/checkpoint.h"
#include "runtime/stage_gather.h"
#include "runtime/trainer_run.h"

namespace ht::runtime {

namespace {

using json = nlohmann::json;

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

// A metadata integer as written: int64_t for counts and positions, uint64_t for a
// dropout stream's offset (written from one, so a '-' is refused).
template <typename T>
T metadata_number(const Checkpoint& c, const std::string& key) {
  const std::string& text = metadata_text(c, key);
  T v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  HT_CHECK(!text.empty() && ec == std::errc() && end == text.data() + text.size(), "checkpoint ", c.path,
           ": metadata '", key, "' is '", text, "'; expected ",
           std::is_signed_v<T> ? "an integer" : "a non-negative integer", " within 64 bits");
  return v;
}

int64_t metadata_int(const Checkpoint& c, const std::string& key) { return metadata_number<int64_t>(c, key); }

// The model a checkpoint records (its metadata 'model_config', where it has one) must be
// the config's, dropout aside: the weights' shapes do not tell every model field (the
// GPT's heads).
void check_model_config(const Checkpoint& ckpt, const config::Config& cfg, const std::string& path) {
  const auto it = ckpt.metadata.find("model_config");
  if (it == ckpt.metadata.end()) return;
  json trained, asked = json::parse(config::to_json(cfg))["model"];
  try {
    trained = json::parse(it->second);
  } catch (const json::exception& e) {
    fail("checkpoint ", path, ": metadata 'model_config' is not JSON (", e.what(), "); the file is corrupt");
  }
  if (trained.is_object()) trained.erase("dropout");
  asked.erase("dropout");
  HT_CHECK(trained == asked, "checkpoint ", path, " was trained with the model ", trained.dump(),
           " but this config's model is ", asked.dump(),
           "; expected the config it was trained with (other weights taken as this model would give wrong figures)");
}

}  // namespace

namespace trainer_run {

// What the guard's state is of: the world, its replicas and their stages (a quarantine
// names a stage's members, a norm history a group of its parameters). A resumed run takes
// the checkpoint's guard only over the same.
std::string Run::guard_layout() const {
  json layout = {{"world", world_.size()}, {"replicas", plan_.layout.replicas}, {"stages", plan_.stage_ranges}};
  // Under local a rank's guard is of its group's members only.
  if (plan_.local) layout["local_groups"] = plan_.local->groups;
  return layout.dump();
}

std::map<std::string, std::string> Run::metadata(int64_t step) {
  std::map<std::string, std::string> m = {
      {"hetrain.version", HETRAIN_VERSION},
      {"config", cfg_.name},
      {"model", cfg_.model.type},
      {"step", std::to_string(step)},
      {"total_steps", std::to_string(total_steps_)},
      {"seed", std::to_string(cfg_.train.seed)},
      // The data stream is a pure function of (seed, position): this is its state.
      {"sample_position", std::to_string(stream_base_ + step * cfg_.train.batch_size)},
      // What a reader outside hetrain needs to rebuild the model and feed it as training did.
      {"model_config", json::parse(config::to_json(cfg_))["model"].dump()}};
  if (cfg_.data.dataset == "fashion_mnist") {
    // As the float was written (0.286), not its double expansion (0.28600001335144043).
    auto shortest = [](float f) {
      char b[32];
      return std::strtod(std::string(b, std::to_chars(b, b + sizeof b, f).ptr).c_str(), nullptr);
    };
    m["input_normalization"] = json{{"input", "pixel / 255"},
                                    {"mean", shortest(data::kFashionMnistMean)},
                                    {"std", shortest(data::kFashionMnistStd)},
                                    {"normalized", "(input - mean) / std"}}.dump();
  }
  // Dropout streams live with each stage's blocks: replica 0's ranks report theirs.
  json mine = json::object();
  mine["loss_finite"] = std::isfinite(last_loss_sum_);  // checked before any checkpoint is written
  mine["guard"] = executor_->guard_state();
  if (executor_->replica() == 0)
    for (int b = executor_->rank_plan().block_begin; b < executor_->rank_plan().block_end; ++b)
      mine[std::to_string(b)] = model_.block(static_cast<size_t>(b)).random_offset();
  // Under deadline the replicas are identical (rank 0 is replica 0) and no exchange may
  // wait for a stalled rank of another replica: rank 0's replica's own streams are the
  // checkpoint's (on a hybrid plan its stages are at one step after every step).
  const std::vector<std::string> all =
      !executor_->deadline() ? world_.allgather(mine.dump(), peer_timeout(), "the checkpoint's dropout streams")
      : plan_.stage_ranges.size() > 1 && executor_->replica() == 0
          ? executor_->replica_allgather(mine.dump(), "the checkpoint's dropout streams of replica 0")
          : std::vector<std::string>{mine.dump()};
  const bool every_rank = all.size() == static_cast<size_t>(world_.size());
  if (every_rank || executor_->deadline()) m["guard.layout"] = guard_layout();
  // Under deadline no exchange may wait for every rank, but the quarantine is derived from
  // the records every member applies, so rank 0's is every member's: it is the checkpoint's
  // for all of them (the norm histories, each rank's own, start afresh on resume).
  if (!every_rank && executor_->deadline()) {
    json state = json::parse(executor_->guard_state());
    state["norms"] = json::array();
    m["guard.quarantine"] = state.dump();
  }
  for (size_t r = 0; r < all.size(); ++r) {
    const json offsets = json::parse(all[r]);
    HT_CHECK(offsets["loss_finite"].get<bool>(), "not writing the checkpoint of step ", step, ": rank ", r,
             "'s loss in that step is not finite, so the model may be poisoned; the newest checkpoint in ",
             checkpoints_.dir(), " stays the newest valid one (", divergence_advice(local_ != nullptr), ")");
    // Every rank's guard, where every rank's item came (not under deadline, whose leader
    // carries the quarantine in its records and catches up a returning rank with it).
    if (every_rank) m["guard.rank." + std::to_string(r)] = offsets["guard"].get<std::string>();
    for (auto it = offsets.begin(); it != offsets.end(); ++it)
      if (it.key() == "loss_finite" || it.key() == "guard") continue;
      else if (const auto off = it.value().get<uint64_t>())
        m["random_offset.block." + it.key()] = std::to_string(off);
  }
  return m;
}

// Collective: rank 0 writes one whole-model checkpoint, whatever the world size. Over
// several ranks (not local, whose members each hold the whole model) the other stages'
// weights come into rank 0's model first (it evaluates with them too), and their
// optimiser state is streamed into the file a tensor at a time as the ranks holding it
// send it: rank 0 never holds the whole model's state (plan::host_memory counts one
// block's).
void Run::save(int64_t step, report::Progress& progress) {
  Allocator::HostStaging staging;
  const std::string what = "the checkpoint gather of step " + std::to_string(step);
  const bool streamed = !local_ && multi();
  if (streamed) gather_to_root(plan_, *executor_, model_, world_, cfg_.train.optimizer, false, peer_timeout(), what);
  const std::vector<nn::NamedTensor> state = local_     ? local_inner_state()
                                             : streamed ? std::vector<nn::NamedTensor>{}
                                                        : executor_->optimizer()->state();
  std::map<std::string, std::string> meta = metadata(step);
  // Rank 0's loss scale (under local, its group's), for every rank on resume; none when
  // rank 0 is idle, and a resumed run starts from train.loss_scale.initial.
  if (const DynamicLossScale* ls = executor_->loss_scale()) {
    meta["loss_scale_log2"] = std::to_string(ls->log2_scale());
    meta["loss_scale_clean_steps"] = std::to_string(ls->clean_steps());
  }
  // The shares (and micro-batch counts) the job steps by now, which rebalancing moves off
  // the plan's: a resume over the same layout starts from them (plan/resumed_shares.h),
  // not from the plan's, which the checks would move again.
  if (!local_ && plan_.layout.replicas.size() > 1) meta["shares"] = plan::shares_metadata(plan_);
  if (local_) {
    meta["sync_policy"] = "local";
    meta["outer_steps"] = std::to_string(local_->outer_steps());
    // The round's split as the job steps by it now (a re-split from measurement moves it
    // off the plan's): a resume under the same groups and H continues the sample stream
    // by it, where the plan's split would repeat some of the round's samples and skip others.
    meta["local.split"] = json{{"groups", plan_.local->groups},
                               {"inner_steps", plan_.local->inner_steps},
                               {"group_steps", plan_.local->group_steps},
                               {"round_samples", plan_.local->round_samples}}.dump();
  }
  auto stream = [&](const std::function<void(const Tensor&)>& sink) {
    stream_optimizer_state(plan_, *executor_, model_, world_, cfg_.train.optimizer, peer_timeout(), what, sink);
  };
  if (!root_) {
    if (streamed) stream([](const Tensor&) {});  // sends; only rank 0's sink is called
    return;
  }
  const std::vector<nn::NamedTensor> weights = prefixed("model.", model_.named_parameters());
  const std::vector<nn::NamedTensor> outer = local_ ? local_->outer_state() : std::vector<nn::NamedTensor>{};
  std::vector<CheckpointSlot> slots;
  for (const auto& [name, t] : weights) slots.push_back({name, t.dtype(), t.shape()});
  if (streamed)
    for (CheckpointSlot& s : optimizer_state_slots(plan_, model_, cfg_.train.optimizer)) {
      s.name = "optim." + s.name;
      slots.push_back(std::move(s));
    }
  for (const auto& [name, t] : prefixed("optim.", state)) slots.push_back({name, t.dtype(), t.shape()});
  for (const auto& [name, t] : outer) slots.push_back({name, t.dtype(), t.shape()});
  const std::string path = checkpoints_.save(step, std::move(slots), meta, [&](CheckpointWriter& out) {
    for (const auto& [name, t] : weights) out.write(t);
    if (streamed) stream([&](const Tensor& t) { out.write(t); });
    for (const auto& [name, t] : state) out.write(t);
    for (const auto& [name, t] : outer) out.write(t);
  });
  progress.note("checkpoint " + path);
}

// Every rank loads its stage from the newest valid checkpoint; returns its step.
// Under local, on resume: the split the checkpoint's run stepped by (a re-split from
// measurement), where its groups and H are this plan's, so that the round's samples go
// on as they were taken; else this plan's own split stands (its rounds are its own).
void Run::resume_local_split(const Checkpoint& loaded, const std::string& text) {
  std::optional<plan::RoundSplit> recorded;
  try {
    recorded = plan::read_local_split(text, plan_);
  } catch (const Error& e) {  // a config error's status (2) would blame the config
    fail("checkpoint ", loaded.path, ": metadata 'local.split': ", e.what(), " (the file is corrupt)");
  }
  if (!recorded) return;
  const plan::RoundSplit& split = *recorded;
  if (split.steps == plan_.local->group_steps && split.samples == plan_.local->round_samples) return;
  try {
    local_->resume_split(split);  // checks it against the plan
  } catch (const Error& e) {
    fail("checkpoint ", loaded.path, ": metadata 'local.split' does not fit this plan: ", e.what(),
         " (the file is corrupt)");
  }
  plan_.local->group_steps = split.steps;
  plan_.local->round_samples = split.samples;
  if (root_) {
    std::string samples;
    for (int64_t n : split.samples) samples += (samples.empty() ? "" : ", ") + std::to_string(n);
    std::fprintf(stderr, "hetrain: note: local: the rounds go on by the split the checkpoint's run stepped by (the "
                         "groups' samples a round %s), not the plan's\n", samples.c_str());
  }
}

int64_t Run::restore(report::Progress& progress) {
  std::vector<std::string> skipped;
  std::optional<Checkpoint> loaded;
  {
    Allocator::HostStaging staging;
    // Verified whole, kept not: each rank reads what it loads from the file, a tensor at
    // a time (the weights it keeps, its stage's optimiser state), never the whole model's
    // state.
    loaded = checkpoints_.load_newest_valid(skipped, false);
  }
  // On stderr, --quiet or not: the newest checkpoint being passed over matters.
  if (root_)
    for (const std::string& s : skipped) std::fprintf(stderr, "hetrain: warning: %s\n", s.c_str());
  if (!loaded) {
    // On stderr too: a resume that starts afresh (a mistyped directory, say) must not pass
    // unseen under --quiet.
    if (root_)
      std::fprintf(stderr, "hetrain: warning: no checkpoint in %s to resume from; training starts at step 0\n",
                   checkpoints_.dir().c_str());
    return 0;
  }
  check_model_config(*loaded, cfg_, loaded->path);
  const auto& meta = loaded->metadata;
  auto get = [&](const std::string& key) { return metadata_text(*loaded, key); };
  auto get_int = [&](const std::string& key) { return metadata_int(*loaded, key); };
  HT_CHECK(get("model") == cfg_.model.type, "checkpoint ", loaded->path, " holds a ",
           get("model"), " model but the config builds a ", cfg_.model.type, " model");
  HT_CHECK(get("seed") == std::to_string(cfg_.train.seed), "checkpoint ", loaded->path,
           " was trained with seed ", get("seed"), " but this run's train.seed is ",
           cfg_.train.seed, "; resuming with another seed would not continue the same run");
  // Every weight is checked against the checkpoint; those this rank released
  // (build_in_host_staging) are not loaded (load_into).
  std::vector<nn::NamedTensor> weights = model_.named_parameters();
  if (executor_->borrows_weights()) {  // the hub loads those it shares; they are checked here all the same
    Allocator::HostStaging staging;
    for (auto& [name, t] : weights)
      for (const auto& [shared, p] : executor_->parameters())
        if (name == shared) t = Tensor::empty(t.shape(), t.dtype(), t.backend());
  }
  load_into(prefixed("model.", weights), *loaded, "model.");
  load_stage(*loaded, *executor_);
  // Training takes at most one optimiser step a job step (none where the guard or the
  // loss scale skips one): a count past the checkpoint's step is a damaged file, which
  // had failed only at the next checkpoint, its int32 counter run past.
  if (const optim::Optimizer* opt = executor_->active() ? executor_->optimizer() : nullptr; opt && meta.count("step"))
    HT_CHECK(opt->step_count() <= get_int("step"), "checkpoint ", loaded->path, ": its optimizer state counts ",
             opt->step_count(), " steps, past the checkpoint's step ", get_int("step"),
             "; expected at most one optimizer step a training step (the file is corrupt)");
  if (meta.count("loss_scale_log2") && executor_->loss_scale()) {
    const int64_t log2 = get_int("loss_scale_log2");
    HT_CHECK(log2 >= -1000 && log2 <= 1000, "checkpoint ", loaded->path, ": metadata 'loss_scale_log2' is ", log2,
             "; expected the exponent of a loss scale within train.loss_scale's min and max");
    const double scale = std::ldexp(1.0, static_cast<int>(log2));
    HT_CHECK(scale >= executor_->loss_scale()->min_scale() && scale <= executor_->loss_scale()->max_scale(),
             "checkpoint ", loaded->path, ": its loss scale 2^", log2, " is outside this config's train.loss_scale [",
             executor_->loss_scale()->min_scale(), ", ", executor_->loss_scale()->max_scale(),
             "]; expected one within min and max (widen them to resume from it)");
    executor_->restore_loss_scale(scale, get_int("loss_scale_clean_steps"));
  }
  // The guard as it was, where the layout is the checkpoint's (a quarantine names members
  // of this layout's stages), or the same world and stages with the replicas in another
  // order (a new probe's plan: the quarantine follows the ranks); over another one the
  // guard starts afresh, which rank 0 says where it drops a quarantine.
  // A deadline run's checkpoint holds rank 0's quarantine alone, which every member
  // applied: a run under another policy takes it as deadline's members do (it had
  // dropped it without a word).
  std::string key = "guard.rank." + std::to_string(world_.rank());
  if (!meta.count(key)) key = "guard.quarantine";
  if (meta.count(key) && meta.count("guard.layout")) {
    std::string state = get(key);
    bool held = false;  // the checkpoint's quarantine holds an offence or a release step
    try {
      if (const json j = json::parse(state); j.contains("quarantine")) {
        const auto q = j["quarantine"].get<std::vector<int64_t>>();
        held = q.size() > 2 && std::any_of(q.begin() + 2, q.end(), [](int64_t v) { return v != 0; });
      }
      if (get("guard.layout") != guard_layout()) {
        const json before = json::parse(get("guard.layout")), after = json::parse(guard_layout());
        const int stage = executor_->active() ? executor_->stage() : 0;
        // Under deadline the checkpoint holds rank 0's quarantine, of its stage's replicas:
        // every rank reorders it by the ranks of that stage, so that all agree.
        const int column = key == "guard.quarantine" ? std::max(0, stage_in(before, 0)) : stage;
        state = guard_state_for(state, before, after, world_.rank(), stage, column);
      }
      if (!state.empty()) executor_->restore_guard_state(state);
    } catch (const json::exception& e) {
      fail("checkpoint ", loaded->path, ": metadata '", key, "' or 'guard.layout': ", e.what(), " (the file is corrupt)");
    } catch (const Error& e) {
      fail("checkpoint ", loaded->path, ": metadata '", key, "': ", e.what(), " (the file is corrupt)");
    }
    if (state.empty() && root_ && held)
      std::fprintf(stderr, "hetrain: note: the checkpoint's bad-node guard is of another layout (%s) whose ranks this "
                           "one does not hold alike; its quarantine starts afresh\n", get("guard.layout").c_str());
  }
  if (local_) {  // the checkpoint's model is the outer weights
    local_->reset_to_weights();
    local_->load_outer_state(*loaded);
    // The count goes on from the checkpoint's (none in a synchronous run's).
    if (meta.count("outer_steps")) {
      const int64_t outer = get_int("outer_steps");
      HT_CHECK(outer >= 0, "checkpoint ", loaded->path, ": metadata 'outer_steps' is ", outer,
               "; expected a count from 0 (the file is corrupt)");
      local_->set_outer_steps(outer);
    }
    if (meta.count("local.split")) resume_local_split(*loaded, get("local.split"));
  }
  for (size_t i = 0; i < model_.size(); ++i) {
    std::string key = "random_offset.block." + std::to_string(i);
    model_.block(i).set_random_offset(meta.count(key) ? metadata_number<uint64_t>(*loaded, key) : 0);
  }
  int64_t step = get_int("step");
  HT_CHECK(step >= 0, "checkpoint ", loaded->path, " is at step ", step, ", before the first; expected 0 to ",
           total_steps_, " (the file is corrupt)");
  // The config asks for fewer steps than the run has taken: a setting to change (exit 2).
  if (step > total_steps_)
    throw config::ConfigError("checkpoint " + loaded->path + " is at step " + std::to_string(step) +
                              ", past the configured " + std::to_string(total_steps_) + " steps; expected 0 to " +
                              std::to_string(total_steps_) + " (raise train.steps to train further)");
  // Continue the data stream where it stopped, even if train.batch_size changed; every
  // position the rest of the run reads must fit its 64 bits.
  const int64_t position = get_int("sample_position");
  int64_t done = 0, base = 0, last = 0;
  HT_CHECK(position >= 0 && !__builtin_mul_overflow(step, cfg_.train.batch_size, &done) &&
               !__builtin_sub_overflow(position, done, &base) &&
               !__builtin_mul_overflow(total_steps_, cfg_.train.batch_size, &last) &&
               !__builtin_add_overflow(base, last, &last),
           "checkpoint ", loaded->path, ": metadata 'sample_position' is ", position,
           "; expected a sample count from 0 that this run's ", total_steps_, " steps of ", cfg_.train.batch_size,
           " samples can continue from (the file is corrupt)");
  stream_base_ = base;
  progress.note("resuming " + cfg_.name + " from " + loaded->path + " at step " +
                std::to_string(step) + " of " + std::to_string(total_steps_));
  return step;
}

}  // namespace trainer_run

std::string evaluate_checkpoint(const config::Config& cfg, const std::string& path) {
  set_thread_count(resolve_thread_count());
  // One process, on rank 0's device where the config lists one per rank.
  const std::string note = select_run_device(
      cfg, 0, cfg.rank_devices.empty() ? 1 : static_cast<int>(cfg.rank_devices.size()), 0);
  if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
  // The weights alone are read, one at a time as they load: the optimiser state, two
  // thirds of an AdamW checkpoint, is verified as it streams past and not kept.
  Checkpoint ckpt = read_checkpoint(path, false);
  check_model_config(ckpt, cfg, path);  // dropout aside: it is off when evaluating
  // As a resume checks them (one edited by hand, its CRC made again, was evaluated).
  if (ckpt.metadata.count("model"))
    HT_CHECK(metadata_text(ckpt, "model") == cfg.model.type, "checkpoint ", path, " holds a ",
             metadata_text(ckpt, "model"), " model but the config builds a ", cfg.model.type, " model");
  const bool has_step = ckpt.metadata.count("step") > 0;
  const int64_t step = has_step ? metadata_int(ckpt, "step") : 0;
  HT_CHECK(step >= 0, "checkpoint ", path, ": metadata 'step' is ", step, "; expected a count of steps, 0 or more");
  std::unique_ptr<Task> task = make_task(cfg, run_device());
  nn::Sequential model = task->build_model(cfg.train.seed);
  load_into(prefixed("model.", model.named_parameters()), ckpt, "model.");
  // The whole model onto the device; where it does not fit (one trained with its stages on
  // several devices), it stays in host memory and streams through the device a block at
  // a time, as rank 0's evaluation in training does.
  try {
    for (const auto& [name, p] : model.named_parameters()) p.rehome(task->device(), false);
  } catch (const OutOfMemory&) {
    for (const auto& [name, p] : model.named_parameters()) p.rehome(cpu_backend(), false);
    model.stream_weights_to(&task->device());
  }
  model.set_training(false);
  NoGradGuard no_grad;
  EvalResult r = task->evaluate(model);
  check_finite_eval(r, "checkpoint " + path);
  json out = {{"checkpoint", path}, {"config", cfg.name}};
  if (has_step) out["step"] = step;
  for (const auto& [k, v] : r.metrics) out[k] = v;
  std::fprintf(stderr, "%s: %s\n", path.c_str(), r.line.c_str());
  return out.dump();
}

}  // namespace ht::runtime
