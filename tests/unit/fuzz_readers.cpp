#include "tests/unit/fuzz_readers.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "config/config.h"
#include "core/crc32.h"
#include "core/error.h"
#include "data/idx_file.h"
#include "models/models.h"
#include "plan/block_costs.h"
#include "plan/cluster_model.h"
#include "plan/plan_json.h"
#include "plan/planner.h"
#include "plan/policy_plan.h"
#include "plan/what_if.h"
#include "probe/fingerprint.h"
#include "runtime/checkpoint.h"
#include "runtime/fault_injection.h"
#include "tensor/tensor.h"
#include "tests/unit/probe_fixtures.h"

namespace ht::fuzz {

namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("fuzz: cannot read the seed file " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("fuzz: cannot write the scratch file " + path);
}

// configs/ of the source tree: the catalogue path the build bakes in sits there.
fs::path configs_dir() { return fs::path(plan::default_catalogue_path()).parent_path(); }

// splitmix64: tiny, and the same sequence on every machine.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

const std::string& digits_5000() {
  static const std::string d = "1" + std::string(4999, '7');
  return d;
}

// Numbers at the edges of what a reader converts: past int64, uint64 and double, negative
// where sizes are expected, and the 5,000-digit one.
std::vector<std::string> edge_numbers() {
  return {"0", "-1", "-0", "1e999", "-1e999", "1e-999", "2147483647", "2147483648", "1000000000",
          "4294967295", "4294967296",
          "9223372036854775807", "9223372036854775808", "-9223372036854775809",
          "18446744073709551615", "18446744073709551616", "1.5", "NaN", "0x10", digits_5000(),
          "-" + digits_5000(), "0." + digits_5000(), "1e" + digits_5000()};
}

std::vector<std::string> tokens() {
  std::vector<std::string> t = {std::string(1, '\0'), "[", "]", "{", "}", "\"", ",", ":", "\\",
                                "\\u0000", "\\ud800", "\xff", "\xc3", "\xe2\x82", "null", "true",
                                "[]", "{}", "\"\"", "-", "\"__metadata__\":{},", "\n"};
  for (const std::string& n : edge_numbers()) t.push_back(n);
  return t;
}

size_t digit_runs(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] >= '0' && s[i] <= '9' && (i == 0 || s[i - 1] < '0' || s[i - 1] > '9')) ++n;
  return n;
}

// Replaces the `which`-th run of digits (mod their count) with `with`.
std::string replace_number(const std::string& s, size_t which, const std::string& with) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < s.size();) {
    if (s[i] >= '0' && s[i] <= '9') {
      size_t j = i;
      while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
      runs.emplace_back(i, j - i);
      i = j;
    } else {
      ++i;
    }
  }
  if (runs.empty()) return s + with;
  const auto [at, len] = runs[which % runs.size()];
  std::string out = s;
  out.replace(at, len, with);
  return out;
}

// Little-endian bytes of v, `width` of them.
std::string le_bytes(uint64_t v, size_t width) {
  std::string b(width, '\0');
  for (size_t i = 0; i < width; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return b;
}

std::vector<uint64_t> edge_integers(uint64_t size) {
  return {0, 1, 7, 8, size - 9, size - 8, size - 1, size, size + 1, 0x7fffffff, 0x80000000,
          0xffffffff, 100'000'000, 100'000'001, uint64_t{1} << 40, 0x7fffffffffffffff,
          0x8000000000000000, ~uint64_t{0}};
}

// One mutation of `s`.
void mutate_once(std::string& s, Rng& rng, bool json) {
  const size_t n = s.size();
  switch (rng.below(json ? 9 : 8)) {
    case 0: {  // flip bits in a few bytes
      const size_t k = 1 + rng.below(4);
      for (size_t i = 0; i < k && n; ++i) s[rng.below(n)] ^= static_cast<char>(1 + rng.below(255));
      break;
    }
    case 1: {  // a byte set to a structural or hostile value
      static const char special[] = {'\0', '\xff', '"', '[', '{', '}', ']', ',', ':', '\\', '-', '0', '9', ' '};
      if (n) s[rng.below(n)] = special[rng.below(sizeof special)];
      break;
    }
    case 2:  // truncation
      s.resize(rng.below(n + 1));
      break;
    case 3: {  // an inserted token
      const auto t = tokens();
      s.insert(rng.below(n + 1), t[rng.below(t.size())]);
      break;
    }
    case 4: {  // a range deleted
      const size_t at = rng.below(n + 1);
      s.erase(at, 1 + rng.below(64));
      break;
    }
    case 5: {  // a range copied elsewhere (duplicates keys, entries, brackets)
      if (!n) break;
      const size_t from = rng.below(n), len = 1 + rng.below(std::min<size_t>(256, n - from));
      s.insert(rng.below(n + 1), s.substr(from, len));
      break;
    }
    case 6: {  // a number replaced by an edge value
      const auto e = edge_numbers();
      s = replace_number(s, rng.below(1 << 16), e[rng.below(e.size())]);
      break;
    }
    case 7: {  // an integer field overwritten in place (length fields, IDX dimensions)
      if (n < 4) break;
      const size_t width = rng.below(2) ? 4 : std::min<size_t>(8, n);
      const size_t at = rng.below(std::min<size_t>(n - width + 1, 32));  // headers sit up front
      const auto e = edge_integers(n);
      std::string b = le_bytes(e[rng.below(e.size())], width);
      if (rng.below(2)) std::reverse(b.begin(), b.end());  // IDX is big-endian
      s.replace(at, width, b);
      break;
    }
    case 8: {  // deep nesting spliced in
      const size_t depth = rng.below(2) ? 100'000 : 40 + rng.below(60);
      const std::string open = rng.below(2) ? "[" : "{\"k\":";
      std::string nest;
      nest.reserve(depth * open.size() + depth);
      for (size_t i = 0; i < depth; ++i) nest += open;
      nest += "0";
      nest.append(depth, open == "[" ? ']' : '}');
      s.insert(rng.below(n + 1), nest);
      break;
    }
  }
}

// The offset of the checksum digits in a checkpoint file, or npos.
size_t crc_digits(const std::string& file) {
  const std::string needle = std::string("\"") + runtime::kCrcKey + "\":\"";
  const size_t at = file.find(needle);
  if (at == std::string::npos || file.find(needle, at + 1) != std::string::npos) return std::string::npos;
  const size_t d = at + needle.size();
  return d + 8 <= file.size() ? d : std::string::npos;
}

// What the writer would have stamped: CRC-32 of the file with the digits zeroed.
std::string restamp(std::string file) {
  const size_t d = crc_digits(file);
  if (d == std::string::npos) return file;
  file.replace(d, 8, "00000000");
  file.replace(d, 8, crc32_hex(crc32_update(0, file.data(), file.size())));
  return file;
}

std::string gzip_bytes(const std::string& raw, const std::string& scratch) {
  gzFile f = gzopen(scratch.c_str(), "wb");
  if (!f || gzwrite(f, raw.data(), static_cast<unsigned>(raw.size())) != static_cast<int>(raw.size()) ||
      gzclose(f) != Z_OK)
    throw std::runtime_error("fuzz: cannot gzip the IDX seed");
  return slurp(scratch);
}

// A tiny IDX images file: 3 images of 28x28, a different value per pixel.
std::string idx_images_seed() {
  std::string b = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 28, 0, 0, 0, 28};
  for (int i = 0; i < 3 * 28 * 28; ++i) b.push_back(static_cast<char>(i % 251));
  return b;
}

std::string idx_labels_seed() {
  std::string b = {0, 0, 8, 1, 0, 0, 0, 5};
  for (char l : {1, 0, 9, 3, 3}) b.push_back(l);
  return b;
}

// A probe file of two ranks, one with a GPU and a CPU quota, with block timings.
std::string cluster_seed() { return probe::cluster_to_json(test_fixtures::two_rank_probe()); }

// The planner's input for `model` over a synth: cluster, forced data-parallel.
plan::PlannerInput seed_input(const std::string& synth, const nn::Sequential& model, int64_t batch) {
  plan::PlannerInput in;
  in.cluster = plan::cluster_from_synth(synth, plan::default_catalogue_path());
  in.costs = plan::block_costs(model, in.cluster, config::OptimizerConfig{});
  in.global_batch = batch;
  in.strategy = config::ParallelStrategy::data;
  return in;
}

// A planner plan: the CNN over a GPU and two CPUs forced data-parallel, so every rank
// has a share and a schedule.
std::string plan_seed() {
  return plan::plan_to_json(plan::make_plan(seed_input("synth:1xrtx4090,2xcpu-16c", models::build_cnn({}, 1), 64)));
}

// A plan under one of the other sync policies: the MLP over four unequal CPUs, under
// local (its groups, round and outer step: the section check_local_plan reads) or
// deadline (its reduction instructions), so that mutations reach those readers too.
std::string policy_plan_seed(config::SyncPolicy policy) {
  plan::PlannerInput in = seed_input("synth:1xcpu-32c,1xcpu-16c,2xcpu-8c", models::build_mlp({}, 1), 128);
  in.flush_every = 50;
  return plan::plan_to_json(plan::plan_for_policy(in, policy, 0));
}

// The same plan carrying one of every structured fact the file stores (each memory step,
// note and problem kind, a baseline shortfall), so that mutations reach their readers.
std::string plan_facts_seed() {
  plan::Plan p = plan::plan_from_json(plan_seed(), "seed");
  std::vector<plan::MemoryStep> steps(5);
  for (size_t i = 0; i < steps.size(); ++i) {
    steps[i].kind = static_cast<plan::MemoryStepKind>(i);
    steps[i].use = {1, 2, 3, 4};
    steps[i].capacity = 8;
    steps[i].activations_before = 4;
    steps[i].activations_after = 2;
    steps[i].micro_batches = 2;
    steps[i].micro_batch_size = 3;
    steps[i].state_bytes = 6;
    steps[i].group_size = 3;
    steps[i].kept_fraction = 0.5;
    steps[i].stage = 0;
    steps[i].for_rank = 2;
  }
  p.ranks[1].memory_steps = steps;
  p.ranks[1].memory_strategies = {plan::MemoryStrategy::recompute, plan::MemoryStrategy::micro_batches,
                                  plan::MemoryStrategy::optimizer_sharding};
  p.ranks[2].slow_link = true;
  p.ranks[2].link_seconds = 4e-3;
  p.ranks[2].cluster_link_seconds = 1e-3;
  plan::Shortfall shortfall;
  shortfall.rank = 1;
  shortfall.device = "cpu-16c";
  shortfall.capacity = 9;
  shortfall.block_end = 2;
  shortfall.samples = 3;
  shortfall.need = {4, 3, 2, 1};
  p.baseline.shortfalls = {shortfall};
  plan::LayoutProblem batch, split, memory;
  batch.kind = plan::LayoutProblemKind::batch_below_replicas;
  batch.global_batch = 2;
  batch.replicas = 3;
  split.kind = plan::LayoutProblemKind::no_stage_split;
  split.split = {plan::StageSplitProblem::block_too_large, 4, 2, 1, 0, "rtx4090", 24e9, 30e9, 24e9, 0, 1e9};
  memory.shortfall = shortfall;
  for (size_t k = 0; k <= static_cast<size_t>(plan::NoteKind::shape); ++k) {
    plan::PlanNote n;
    n.kind = static_cast<plan::NoteKind>(k);
    n.ranks = {0, 2};
    n.work = {{"rtx4090", 1, 0.9}, {"cpu-16c", 2, 0.1}};
    n.seconds = 0.5;
    n.other_seconds = 0.75;
    n.stages = n.replicas = n.ranks_used = n.world = 3;
    if (n.kind == plan::NoteKind::uniform_baseline) n.problem = memory;
    p.notes.push_back(n);
  }
  for (const plan::LayoutProblem& problem : {batch, split, memory}) {
    plan::PlanNote n;
    n.stages = n.replicas = n.ranks_used = n.world = 1;
    n.problem = problem;
    p.notes.push_back(n);
  }
  return plan::plan_to_json(p);
}

// A config with every section and most settings given, under local or deadline (each
// policy's own settings are a config error under the other), so that mutations reach the
// readers of parallel, guard, run, emulate and the loss scale, which the configs in
// configs/ leave out.
std::string full_config_seed(const std::string& parallel) {
  return R"({
  "description": "every section, for the reader fuzz",
  "device": "cpu",
  "model": {"type": "mlp", "hidden": [64, 32]},
  "data": {"dataset": "fashion_mnist", "dir": "/usr/share/datasets/fashion-mnist"},
  "train": {
    "steps": 100, "batch_size": 64, "seed": 7, "micro_batches": 2, "grad_clip": 1.0,
    "optimizer": {"type": "adamw", "lr": 1e-3, "weight_decay": 0.01, "eps": 1e-8},
    "schedule": {"type": "cosine", "warmup_steps": 10, "min_lr": 1e-5},
    "eval_every": 50, "eval_max_samples": 1000, "eval_batch_size": 250, "log_every": 10,
    "precision": "fp32",
    "loss_scale": {"mode": "dynamic", "initial": 1024, "min": 1, "max": 65536, "growth_interval": 100}
  },
  "checkpoint": {"every": 50, "keep": 2},
  "parallel": )" + parallel + R"(,
  "guard": {"norm_ratio": 0, "window": 10, "quarantine_after": 3, "quarantine_steps": 20},
  "run": {"dir": "runs/full"},
  "emulate": {"ranks": [{"rank": 0, "latency_ms": 1, "bandwidth_mb_s": 100, "memory_cap_mb": 512},
                        {"rank": 1, "memory_cap_mb": 256}]}
}
)";
}

std::string checkpoint_seed(const std::string& scratch) {
  runtime::write_checkpoint(scratch,
                            {{"model.w", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, cpu_backend())},
                             {"model.ids", Tensor::from_ints({7, 8}, {2}, cpu_backend())},
                             {"model.empty", Tensor::from_vector({}, {0, 4}, cpu_backend())},
                             {"optim.m", Tensor::from_vector({0.5f, -0.5f}, {2}, cpu_backend())}},
                            {{"step", "10"}, {"sample_position", "640"}, {"note", "caf\xc3\xa9"}});
  return slurp(scratch);
}

}  // namespace

std::vector<Reader> all_readers(const std::string& scratch_dir) {
  const std::string dir = scratch_dir + "/";
  const std::string catalogue = plan::default_catalogue_path();
  auto through_file = [](std::string path, std::function<void(const std::string&)> read) {
    return [path, read](const std::string& bytes) {
      spit(path, bytes);
      read(path);
    };
  };
  auto as_is = [](std::string b, uint64_t) { return b; };
  std::vector<Reader> r;
  for (const char* name : {"fashion_mnist_mlp", "text_gpt_tiny"})
    r.push_back({std::string("config-") + name, slurp(configs_dir() / (std::string(name) + ".json")), true,
                 through_file(dir + "config.json", [](const std::string& p) { config::load_config(p); }),
                 as_is});
  for (const auto& [name, parallel] :
       {std::pair<const char*, const char*>{"config-full-local",
                                            R"({"strategy": "auto", "sync": "local", "local_steps": 10, "outer_delay": 5,
          "outer_lr": 1.2, "outer_momentum": 0.5, "peer_timeout_s": 30, "rebalance_every": 20})"},
        {"config-full-deadline", R"({"strategy": "data", "sync": "deadline", "deadline_slack": 0.5, "max_staleness": 2,
          "peer_timeout_s": 30, "rebalance_every": 20})"}})
    r.push_back({name, full_config_seed(parallel), true,
                 through_file(dir + "config.json", [](const std::string& p) { config::load_config(p); }), as_is});
  r.push_back({"cluster", cluster_seed(), true,
               through_file(dir + "cluster.json",
                            [catalogue](const std::string& p) { plan::load_cluster_model(p, catalogue); }),
               as_is});
  r.push_back({"plan", plan_seed(), true,
               through_file(dir + "plan.json", [](const std::string& p) { plan::read_plan(p); }), as_is});
  r.push_back({"plan-facts", plan_facts_seed(), true,
               through_file(dir + "plan.json", [](const std::string& p) { plan::read_plan(p); }), as_is});
  r.push_back({"plan-local", policy_plan_seed(config::SyncPolicy::local), true,
               through_file(dir + "plan.json", [](const std::string& p) { plan::read_plan(p); }), as_is});
  r.push_back({"plan-deadline", policy_plan_seed(config::SyncPolicy::deadline), true,
               through_file(dir + "plan.json", [](const std::string& p) { plan::read_plan(p); }), as_is});
  r.push_back({"catalogue", slurp(catalogue), true,
               through_file(dir + "devices.json", [](const std::string& p) { plan::read_catalogue(p); }),
               as_is});
  // The options that carry a little language of their own: `train --inject`,
  // `plan --what-if` and `--cluster synth:`.
  r.push_back({"option-inject", "slow:rank=1,at=20,factor=2.5", false,
               [](const std::string& b) { runtime::parse_fault(b); }, as_is});
  r.push_back({"option-what-if", "link:ranks=0-1,at=3,latency=50,bandwidth=6.25", false,
               [](const std::string& b) { plan::parse_what_if_event(b); }, as_is});
  r.push_back({"option-synth", "synth:2xrtx3060,1xrtx4090,2xcpu-16c@pcie", false,
               [catalogue](const std::string& b) { plan::cluster_from_synth(b, catalogue); }, as_is});
  r.push_back({"idx-images", idx_images_seed(), false,
               [](const std::string& b) {
                 data::parse_idx_images(std::vector<uint8_t>(b.begin(), b.end()), "images.idx");
               },
               as_is});
  r.push_back({"idx-labels", idx_labels_seed(), false,
               [](const std::string& b) {
                 data::parse_idx_labels(std::vector<uint8_t>(b.begin(), b.end()), "labels.idx");
               },
               as_is});
  r.push_back({"idx-gzip", gzip_bytes(idx_images_seed(), dir + "seed.gz"), false,
               through_file(dir + "images.gz", [](const std::string& p) { data::read_idx_images(p); }),
               as_is});
  // Every other case gets a valid checksum again, so that the mutation is judged by the
  // checks after it (tensor table, offsets, shapes) rather than always by the checksum.
  r.push_back({"checkpoint", checkpoint_seed(dir + "seed.safetensors"), false,
               through_file(dir + "ckpt.safetensors",
                            [](const std::string& p) { runtime::read_checkpoint(p); }),
               [](std::string b, uint64_t i) { return i % 2 ? restamp(std::move(b)) : b; }});
  // The resume's path: verified without its values, then every tensor read from the file.
  r.push_back({"checkpoint-lazy", checkpoint_seed(dir + "seed.safetensors"), false,
               through_file(dir + "ckpt.safetensors",
                            [](const std::string& p) {
                              const runtime::Checkpoint c = runtime::read_checkpoint(p, false);
                              for (const auto& [name, slot] : c.table) (void)c.get(name);
                            }),
               [](std::string b, uint64_t i) { return i % 2 ? restamp(std::move(b)) : b; }});
  return r;
}

std::vector<std::string> fixed_cases(const Reader& r, size_t max_truncations) {
  const std::string& s = r.seed;
  std::vector<std::string> c = {"", std::string(1, '\0'), std::string(s.size(), '\0'), s + '\0',
                                std::string(1, '\0') + s};
  // Truncation at every byte, or at evenly spaced ones plus the first and last 64.
  const size_t n = s.size();
  if (n <= max_truncations) {
    for (size_t i = 0; i < n; ++i) c.push_back(s.substr(0, i));
  } else {
    for (size_t i = 0; i < 64; ++i) c.push_back(s.substr(0, i)), c.push_back(s.substr(0, n - 1 - i));
    for (size_t k = 0; k < max_truncations; ++k) c.push_back(s.substr(0, k * n / max_truncations));
  }
  // NULs spread through the file.
  for (size_t k = 0; k < 64; ++k) {
    std::string t = s;
    if (!t.empty()) t[k * t.size() / 64] = '\0';
    c.push_back(t);
  }
  if (r.json) {
    c.push_back(std::string(100'000, '[') + std::string(100'000, ']'));
    std::string objects;
    for (int i = 0; i < 100'000; ++i) objects += "{\"a\":";
    c.push_back(objects + "1" + std::string(100'000, '}'));
    c.push_back(std::string(100'000, '['));  // unclosed
    // A deep value where the first key's value was, and just past the limit.
    for (size_t depth : {size_t{64}, size_t{65}, size_t{100'000}}) {
      std::string t = s;
      const size_t colon = t.find(':');
      if (colon != std::string::npos)
        t.insert(colon + 1, std::string(depth, '[') + "1" + std::string(depth, ']') + ",\"x\":");
      c.push_back(t);
    }
    // A 5,000-character key and string value, which messages must not quote in full.
    if (const size_t brace = s.find('{'); brace != std::string::npos) {
      const std::string k(5000, 'k');
      for (const std::string& ins : {"\"" + k + "\":1,", "\"" + k + "\":\"" + k + "\","}) {
        std::string t = s;
        t.insert(brace + 1, ins);
        c.push_back(t);
      }
    }
    // Each of the first 32 numbers replaced by every edge value, and every number by
    // counts that would allocate without bound if a reader sized something by them.
    for (size_t which = 0; which < 32; ++which)
      for (const std::string& e : edge_numbers()) c.push_back(replace_number(s, which, e));
    for (size_t which = 32; which < std::min<size_t>(digit_runs(s), 1000); ++which)
      for (const char* e : {"1000000000", "2147483647", "4294967296", "-1"})
        c.push_back(replace_number(s, which, e));
  } else {
    // Leading length or dimension fields set to edge values, both byte orders.
    for (size_t width : {size_t{4}, size_t{8}})
      for (size_t at = 0; at + width <= std::min<size_t>(n, 24); at += 4)
        for (uint64_t v : edge_integers(n)) {
          std::string le = le_bytes(v, width), be(le.rbegin(), le.rend());
          for (const std::string& b : {le, be}) {
            std::string t = s;
            t.replace(at, width, b);
            c.push_back(t);
          }
        }
    // Numbers inside a text header (the safetensors table): offsets, shapes, lengths.
    if (s.find('{') != std::string::npos)
      for (size_t which = 0; which < 48; ++which)
        for (const std::string& e : edge_numbers()) c.push_back(replace_number(s, which, e));
  }
  for (size_t i = 0; i < c.size(); ++i) c[i] = r.finish(std::move(c[i]), i);
  return c;
}

std::string random_case(const Reader& r, uint64_t index) {
  Rng rng{hash_name(r.name) ^ (index * 0xD1B54A32D192ED03ull)};
  std::string s = r.seed;
  const size_t ops = 1 + rng.below(4);
  for (size_t i = 0; i < ops; ++i) mutate_once(s, rng, r.json);
  return r.finish(std::move(s), index);
}

Result run_case(const Reader& r, const std::string& bytes) {
  try {
    r.read(bytes);
    return {Outcome::parsed, ""};
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.empty()) return {Outcome::bad, "an ht::Error with an empty message"};
    if (m.find('\n') != std::string::npos) return {Outcome::bad, "a message of several lines: " + m};
    if (m.size() > kMaxMessage)
      return {Outcome::bad, "a message of " + std::to_string(m.size()) + " characters: " + m.substr(0, 300)};
    return {Outcome::rejected, m};
  } catch (const std::exception& e) {
    return {Outcome::bad, std::string("not an ht::Error: ") + e.what()};
  } catch (...) {
    return {Outcome::bad, "a non-standard exception"};
  }
}

}  // namespace ht::fuzz
