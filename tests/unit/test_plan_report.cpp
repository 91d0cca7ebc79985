// The plan's two views: the terminal table (`hetrain plan`) and the SVG picture, on a
// hand-made four-rank data-parallel plan whose every field is known.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/units.h"
#include "error_message.h"
#include "plan/plan.h"
#include "report/plan_svg.h"
#include "report/plan_table.h"
#include "report/plan_text.h"
#include "report/trace.h"

using namespace ht;
using namespace ht::plan;
using ht::report::Span;

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

RankPlan rank(int index, const std::string& device, double capacity_gib, int64_t samples,
              int micro_batches, double busy) {
  RankPlan r;
  r.rank = index;
  r.device.id = device;
  r.device.memory_bytes = capacity_gib * kGiB;
  r.replica = index;
  r.stage = 0;
  r.block_begin = 0;
  r.block_end = 8;
  r.samples = samples;
  r.micro_batches = micro_batches;
  r.micro_batch_size = samples / micro_batches;
  r.memory = {1 * kGiB, 1 * kGiB, 2 * kGiB, 0.5 * kGiB};
  r.busy_fraction = busy;
  return r;
}

// Shares 64/32/16/16 over an a100, an rtx3060 that needs recomputation and two t4s that
// differ only in their rank number; rank 0 sits behind a slow link.
Plan sample_plan() {
  Plan p;
  p.config_name = "tiny";
  p.cluster_source = "synth:1xa100,1xrtx3060,2xt4";
  p.world_size = 4;
  p.blocks = 8;
  p.global_batch = 128;
  p.strategy = Strategy::data;
  p.layout.replicas = {{0}, {1}, {2}, {3}};
  p.layout.samples = {64, 32, 16, 16};
  p.layout.micro_batches = {4, 2, 1, 1};
  p.stage_ranges = {{0, 8}};
  p.ranks = {rank(0, "a100", 40, 64, 4, 0.95), rank(1, "rtx3060", 12, 32, 2, 0.9),
             rank(2, "t4", 16, 16, 1, 0.8), rank(3, "t4", 16, 16, 1, 0.8)};
  p.ranks[0].slow_link = true;
  p.ranks[0].link_seconds = 8e-3;
  p.ranks[0].cluster_link_seconds = 1e-3;
  p.ranks[1].recompute = true;
  p.ranks[1].memory_strategies = {MemoryStrategy::recompute};
  MemoryStep over;
  over.use = {4 * kGiB, 4 * kGiB, 2 * kGiB, 3.5 * kGiB};
  over.capacity = 12 * kGiB;
  MemoryStep saved;
  saved.kind = MemoryStepKind::recompute;
  saved.activations_before = 3.5 * kGiB;
  saved.activations_after = 0.5 * kGiB;
  p.ranks[1].memory_steps = {over, saved};
  p.predicted = {0.1, 1280, 0.05};
  p.baseline.stage_ranges = {{0, 8}};
  p.baseline.predicted = {0.2, 640, 0.1};
  p.baseline.fits = false;
  Shortfall shortfall;
  shortfall.rank = 1;
  shortfall.device = "rtx3060";
  shortfall.capacity = 12 * kGiB;
  shortfall.stage = 0;
  shortfall.block_end = 8;
  shortfall.samples = 32;
  shortfall.need = {4 * kGiB, 4 * kGiB, 4 * kGiB, 3.5 * kGiB};
  p.baseline.shortfalls = {shortfall};
  p.speedup = 2.0;
  PlanNote work;
  work.kind = NoteKind::work_by_device;
  work.work = {{"a100", 1, 0.5}, {"t4", 2, 0.25}, {"rtx3060", 1, 0.25}};
  p.notes = {work};
  p.candidates = 12;
  return p;
}

// Rank 2: a forward, a zero-length receive, a gradient send, a wait; rank 0: a forward and
// a zero-length wait; one zero-length compute span on rank 3.
std::vector<Span> sample_timeline() {
  return {{0, "Forward", "compute", 0.0, 0.04, 0, 0},
          {0, "RecvGrad", "idle", 0.04, 0.04, 0, 0},
          {0, "Backward", "compute", 0.04, 0.09, 0, 0},
          {2, "Forward", "compute", 0.0, 0.02, 0, 0},
          {2, "RecvActivation", "comm", 0.02, 0.02, 1, 0},
          {2, "ReduceGrads", "comm", 0.02, 0.03, -1, 0},
          {2, "ReduceGrads", "idle", 0.03, 0.1, -1, 0},
          {3, "LoadMicroBatch", "compute", 0.01, 0.01, 0, 0}};
}

LayoutProblem small_batch(int replicas) {
  LayoutProblem p;
  p.kind = LayoutProblemKind::batch_below_replicas;
  p.replicas = replicas;
  return p;
}

size_t occurrences(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("plan report: format_plan shows ranks, prediction, baseline and reasons") {
  const std::string out = report::format_plan(sample_plan());
  INFO(out);
  CHECK(contains(out, "tiny"));
  CHECK(contains(out, "synth:1xa100,1xrtx3060,2xt4"));
  CHECK(contains(out, "data: 4 replicas"));
  for (const char* device : {"a100*", "rtx3060", "t4"}) CHECK(contains(out, device));
  for (const char* share : {"64 (4x16)", "32 (2x16)", "16 (1x16)"}) CHECK(contains(out, share));
  CHECK(contains(out, "4.50 GiB / 40.00 GiB (11%)"));
  CHECK(contains(out, "1.0/1.0/2.0/0.5 GiB"));
  CHECK(contains(out, "step 100.00 ms, 1280 samples/s, bubble 5%"));
  CHECK(contains(out, "step 200.00 ms, 640 samples/s"));
  CHECK(contains(out, "baseline (equal batches, whole model per rank (DDP)): step 200.00 ms"));
  CHECK(contains(out, "baseline does not fit:\n  rank 1 (rtx3060, 12.00 GiB): 32 samples on blocks 0-7 need "
                      "15.50 GiB (params 4.00 GiB, grads 4.00 GiB, optimizer 4.00 GiB, activations 3.50 GiB), "
                      "3.50 GiB short\n"));
  CHECK(contains(out, "speed-up over baseline: 2.00x"));
  CHECK_FALSE(contains(out, "speed-up over uniform layers"));
  // Beside a baseline that cannot run, the uniform layers of the plan's shape when they fit.
  Plan with_uniform = sample_plan();
  PlanNote u;
  u.kind = NoteKind::uniform_baseline;
  u.stages = 2;
  u.seconds = 0.15;
  with_uniform.notes.push_back(u);
  CHECK(contains(report::format_plan(with_uniform),
                 "\nspeed-up over uniform layers over 2 stages (DeepSpeed's default, which fits): 1.50x\n"));
  with_uniform.notes.back().problem = LayoutProblem{};
  CHECK_FALSE(contains(report::format_plan(with_uniform), "speed-up over uniform layers"));
  CHECK(contains(out, "  rank 1: recompute: needs 13.50 GiB of 12.00 GiB (params 4.00 GiB, grads 4.00 GiB, "
                      "optimizer 2.00 GiB, activations 3.50 GiB); recompute: activations 3.50 GiB -> 512.0 MiB\n"));
  // A reason that starts with its strategy does not repeat it.
  Plan sharded = sample_plan();
  sharded.ranks[2].memory_strategies = {MemoryStrategy::optimizer_sharding};
  MemoryStep kept;
  kept.kind = MemoryStepKind::shard_for_peer;
  kept.kept_fraction = 0.4;
  kept.stage = 0;
  kept.for_rank = 3;
  sharded.ranks[2].memory_steps = {kept};
  CHECK(contains(report::format_plan(sharded),
                 "  rank 2: optimizer sharding: keeps 40.0% of stage 0's optimizer state, sharded for rank 3\n"));
  CHECK_FALSE(contains(report::format_plan(sharded), "optimizer sharding: optimizer sharding"));
  CHECK(contains(out, "rank 0: a 1 MiB message to its typical peer takes 8.00 ms, 8x the cluster's typical 1.00 ms"));
  CHECK(contains(out, "  - work per step by device: a100 (1 rank) 50.0%, t4 (2 ranks) 25.0%, rtx3060 (1 rank) 25.0%\n"));
  CHECK(contains(out, "candidates evaluated: 12"));
  // The header and the table fit a 120-column terminal (the sections below them are
  // sentences, which the terminal wraps); no line ends in blanks.
  const size_t table_end = out.find("\npredicted:");
  REQUIRE(table_end != std::string::npos);
  for (size_t at = 0, end; (end = out.find('\n', at)) != std::string::npos; at = end + 1) {
    if (end <= table_end) CHECK(end - at <= 120);
    CHECK((end == at || out[end - 1] != ' '));
  }
}

TEST_CASE("plan report: the table merges consecutive identical ranks only, the reasons every rank alike") {
  Plan p = sample_plan();
  const std::string merged = report::format_plan(p);
  CHECK(contains(merged, "\n2-3 "));
  CHECK_FALSE(contains(merged, "\n0-1"));
  CHECK(contains(merged, "\n0 "));
  CHECK(contains(merged, "\n1 "));

  p.ranks[3].busy_fraction = 0.5;
  const std::string split = report::format_plan(p);
  CHECK_FALSE(contains(split, "2-3"));
  CHECK(contains(split, "\n2 "));
  CHECK(contains(split, "\n3 "));

  // The sections below the table give a reason once for every rank that has it, with a
  // rank between them that has none (the table keeps rank order: it merges runs only).
  p = sample_plan();
  p.ranks[3].memory_strategies = p.ranks[1].memory_strategies;
  p.ranks[3].memory_steps = p.ranks[1].memory_steps;
  const std::string apart = report::format_plan(p);
  CHECK(contains(apart, "\n  ranks 1, 3: recompute: "));
  CHECK_FALSE(contains(apart, "\n  rank 1: "));
  CHECK_FALSE(contains(apart, "ranks 1-3"));
}

TEST_CASE("plan report: format_plan of a large uniform world stays short") {
  Plan p = sample_plan();
  p.world_size = 1024;
  p.layout.replicas.clear();
  p.ranks.clear();
  for (int i = 0; i < 1024; ++i) {
    p.layout.replicas.push_back({i});
    p.ranks.push_back(rank(i, "h100", 80, 128, 8, 0.7));
  }
  const std::string out = report::format_plan(p);
  INFO(out);
  CHECK(contains(out, "data: 1024 replicas"));
  CHECK(contains(out, "\n0-1023 "));
  CHECK(contains(out, " r0-1023/s0 "));
  CHECK(occurrences(out, "\n") < 40);
}

TEST_CASE("plan report: svg is one standalone document, the same bytes every time") {
  const std::string svg = report::plan_to_svg(sample_plan(), sample_timeline());
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(contains(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  CHECK(occurrences(svg, "<svg") == 1);
  REQUIRE(svg.size() > 7);
  CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
  CHECK(contains(svg, "tiny: data"));
  CHECK(contains(svg, "2.00x"));
  CHECK(contains(svg, ">rank 2 t4<"));
  CHECK(contains(svg, "4.50 GiB / 40.00 GiB"));
  CHECK(svg == report::plan_to_svg(sample_plan(), sample_timeline()));
}

TEST_CASE("plan report: svg draws one rect per span of positive length") {
  const std::vector<Span> timeline = sample_timeline();
  const std::string svg = report::plan_to_svg(sample_plan(), timeline);
  for (const char* category : {"compute", "comm", "idle"}) {
    size_t drawn = 0;
    for (const Span& s : timeline) drawn += s.category == category && s.end_s > s.start_s;
    CHECK(occurrences(svg, "class=\"" + std::string(category) + "\"") == drawn);
  }
  CHECK(occurrences(svg, "class=\"compute\"") == 3);
  CHECK(occurrences(svg, "class=\"comm\"") == 1);
  CHECK(occurrences(svg, "class=\"idle\"") == 1);
  CHECK_FALSE(contains(svg, "RecvActivation"));
  CHECK_FALSE(contains(svg, "LoadMicroBatch"));
  CHECK(contains(svg, "<title>rank 2: ReduceGrads stage=0 20.000–30.000 ms</title>"));
}

TEST_CASE("plan report: svg escapes device names and marks over-capacity ranks") {
  Plan p = sample_plan();
  CHECK_FALSE(contains(report::plan_to_svg(p, {}), "class=\"over\""));

  p.ranks[2].device.id = "gpu<&>\"'";
  p.ranks[1].memory.activations = 20 * kGiB;
  const std::string svg = report::plan_to_svg(p, sample_timeline());
  CHECK_FALSE(contains(svg, "<&>"));
  CHECK(contains(svg, "gpu&lt;&amp;&gt;&quot;&apos;"));
  CHECK(occurrences(svg, "class=\"over\"") == 1);
  CHECK(contains(svg, "24.00 GiB / 12.00 GiB"));
}

TEST_CASE("plan report: svg of a large world draws a lane per run of alike ranks, as its first") {
  Plan p = sample_plan();
  p.ranks.clear();
  std::vector<Span> timeline;
  for (int i = 0; i < 1024; ++i) {
    p.ranks.push_back(rank(i, i < 512 ? "h100" : "a100", 80, 128, 8, 0.7));
    timeline.push_back({i, "Forward", "compute", 0.0, 0.05, 0, 0});
  }
  const std::string svg = report::plan_to_svg(p, timeline);
  // Two lanes (the h100s, the a100s), each labelled with its ranks, in both sections.
  CHECK(occurrences(svg, "class=\"compute\"") == 2);
  CHECK(occurrences(svg, "class=\"capacity\"") == 2);
  CHECK(occurrences(svg, ">ranks 0-511 h100<") == 2);
  CHECK(occurrences(svg, ">ranks 512-1023 a100<") == 2);
  CHECK(contains(svg, "<title>rank 512: Forward mb=0 stage=0"));
  CHECK(contains(svg, "1024 ranks in 2 lanes"));
  // A rank that differs (its share) is a lane of its own; up to 64 ranks every rank is one.
  p.ranks[700].samples = 64;
  CHECK(occurrences(report::plan_to_svg(p, timeline), "class=\"compute\"") == 4);
  p.ranks.resize(64);
  timeline.resize(64);
  const std::string small = report::plan_to_svg(p, timeline);
  CHECK(occurrences(small, "class=\"compute\"") == 64);
  CHECK_FALSE(contains(small, " lanes: "));
  // A span of a rank beyond the plan is refused even where its lane would not be drawn.
  timeline.push_back({64, "Forward", "compute", 0.0, 0.05, 0, 0});
  CHECK_THROWS_AS(report::plan_to_svg(p, timeline), Error);
}

TEST_CASE("plan report: svg rejects spans it cannot place") {
  const Plan p = sample_plan();
  const std::string outside = error_of([&] {
    report::plan_to_svg(p, {{4, "Forward", "compute", 0.0, 0.1, 0, 0}});
  });
  CHECK(contains(outside, "span 0 (Forward) has rank 4; the plan has 4 ranks"));
  const std::string category = error_of([&] {
    report::plan_to_svg(p, {{0, "Forward", "busy", 0.0, 0.1, 0, 0}});
  });
  CHECK(contains(category, "category 'busy'"));
  const std::string backwards = error_of([&] {
    report::plan_to_svg(p, {{0, "Forward", "compute", 0.2, 0.1, 0, 0}});
  });
  CHECK(contains(backwards, "ends at 0.1 s before it starts at 0.2 s"));
}

// The sentences report/plan_text.h makes of the planner's facts: the wording `hetrain
// plan` and `hetrain train` print, checked whole so that a changed number or word fails.
TEST_CASE("plan text: memory steps, shortfalls and stage splits read as sentences") {
  MemoryStep more;
  more.kind = MemoryStepKind::micro_batches;
  more.micro_batches = 4;
  more.micro_batch_size = 8;
  more.activations_before = 64 << 20;
  more.activations_after = 32 << 20;
  CHECK(report::memory_step_text(more) == "micro-batches: 4 of at most 8 samples, activations 64.0 MiB -> 32.0 MiB");
  MemoryStep shard;
  shard.kind = MemoryStepKind::optimizer_sharding;
  shard.state_bytes = 3 * kGiB;
  shard.group_size = 2;
  shard.kept_fraction = 0.125;
  CHECK(report::memory_step_text(shard) ==
        "optimizer sharding: the stage's 3.00 GiB of optimizer state split over its 2 data-parallel ranks by "
        "free memory, keeping 12.5%");
  CHECK(report::memory_strategies_text({}) == "none");
  CHECK(report::memory_strategies_text({MemoryStrategy::recompute, MemoryStrategy::optimizer_sharding,
                                        MemoryStrategy::micro_batches}) ==
        "recompute + optimizer sharding + micro-batches");

  Shortfall s;
  s.rank = 0;
  s.device = "dev0";
  s.capacity = 24e6;
  s.stage = 0;
  s.block_end = 2;
  s.samples = 32;
  s.need = {16e6, 8e6, 0, 4e6};
  s.after_strategies = true;
  s.micro_batches = 32;
  s.micro_batch_size = 1;
  s.sharding_possible = true;
  s.sharded = true;
  CHECK(report::shortfall_text(s) ==
        "rank 0 (dev0, 22.9 MiB) cannot hold stage 0 (blocks 0-1, 32 samples) even with recomputation, 32 "
        "micro-batches of 1 and optimizer sharding: needs 26.7 MiB (params 15.3 MiB, grads 7.6 MiB, optimizer "
        "0 B, activations 3.8 MiB), 3.8 MiB short");
  // Open but not taken (the replicas' free memory could not hold the state): need holds
  // all of the state, and the text does not claim it was sharded.
  s.sharded = false;
  CHECK(contains(report::shortfall_text(s), "micro-batches of 1 (optimizer sharding tried: the stage's replicas have "
                                            "too little free memory for its optimizer state, so it keeps all of it): needs"));
  s.sharding_possible = false;
  CHECK(contains(report::shortfall_text(s), "micro-batches of 1 (no optimizer sharding: one replica, or parallel.sync deadline): needs"));
  s.micro_batches = 1;
  s.micro_batch_size = 32;
  CHECK(contains(report::shortfall_text(s), "even with recomputation, 1 micro-batch of 32 (no optimizer"));

  // Ranks that read alike but for the rank share a line, wherever they are; one that
  // differs (another device) has its own, in the order of first ranks.
  std::vector<Shortfall> list;
  for (int r : {0, 1, 2, 3, 4, 6}) {
    Shortfall x = s;
    x.rank = r;
    if (r == 4) x.device = "dev4";
    list.push_back(x);
  }
  const std::vector<std::string> lines = report::shortfall_lines(list);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].rfind("ranks 0-3, 6 (dev0, 22.9 MiB) cannot hold stage 0", 0) == 0);
  CHECK(lines[1] == report::shortfall_text(list[4]));
  CHECK(lines[0].substr(std::string("ranks 0-3, 6").size()) == report::shortfall_text(s).substr(std::string("rank 0").size()));

  StageSplitFailure f;
  f.problem = StageSplitProblem::block_too_large;
  f.blocks = 12;
  f.stages = 3;
  f.block = 7;
  f.stage = 2;
  f.device = "rtx3060";
  f.device_memory = 12 * kGiB;
  f.needed = 13 * kGiB;
  f.capacity = 12 * kGiB;
  CHECK(report::stage_split_text(f) ==
        "no pipeline split of 12 blocks over 3 devices fits: block 7 alone needs 13.00 GiB on "
        "stage 2 (rtx3060, 12.00 GiB), the roomiest stage that could take it; capacity 12.00 GiB. Use "
        "devices with more memory, fewer in-flight micro-batches or a smaller micro-batch");
  f.whole_model_stage = 2;
  CHECK(contains(report::stage_split_text(f), "capacity 12.00 GiB (with the other blocks' weights, which rank 0 holds)"));
  // Amounts that print alike carry their exact bytes, so that the shortfall shows.
  f.needed = 12 * kGiB + 3;
  CHECK(contains(report::stage_split_text(f),
                 "alone needs 12.00 GiB (12884901891 bytes) on stage 2 (rtx3060, 12.00 GiB), the roomiest stage that "
                 "could take it; capacity 12.00 GiB (12884901888 bytes)"));
  f.problem = StageSplitProblem::stage_too_small;
  CHECK(contains(report::stage_split_text(f),
                 "fits: stage 2 (rtx3060, 12.00 GiB) cannot hold any block it could be given: the lightest, block 7,"));
  f.problem = StageSplitProblem::no_contiguous_split;
  f.needed = 4;
  f.capacity = 3;
  f.all_weights = 2;
  CHECK(contains(report::stage_split_text(f),
                 "not all of them together; the weight state alone totals 4 B against 3 B of "
                 "total capacity, before in-flight activations; and stage 2 is rank 0's"));
  f.capacity = 5;  // the weights fit the stages together: the split's contiguity is what fails
  CHECK(contains(report::stage_split_text(f), "but no contiguous split does; the weight state alone totals 4 B"));

  LayoutProblem small;
  small.kind = LayoutProblemKind::batch_below_replicas;
  small.global_batch = 3;
  small.replicas = 4;
  CHECK(report::layout_problem_text(small) ==
        "global batch 3 is smaller than its 4 data-parallel replicas (every replica needs a sample)");
}

TEST_CASE("plan text: each note kind, and the planner's refusal") {
  PlanNote n;
  n.kind = NoteKind::hub_reduces;
  n.ranks = {0};
  n.seconds = 2e-3;
  n.other_seconds = 5e-3;
  CHECK(report::note_text(n) ==
        "gradients are summed on rank 0 alone: predicted ReduceGrads 2.00 ms against 5.00 ms with parts by share "
        "(every owner must wake to sum its part)");
  n.ranks = {0, 1};
  CHECK(contains(report::note_text(n), "gradients are summed on ranks 0, 1 (one per stage) alone"));
  n.kind = NoteKind::hub_steps_optimizer;
  n.ranks = {2};
  CHECK(report::note_text(n) ==
        "the optimizer steps on rank 2 alone, which holds the summed gradients; the other ranks keep no optimizer "
        "state and receive the updated weights: predicted step 2.00 ms against 5.00 ms with every rank stepping "
        "its own");
  n.kind = NoteKind::idle_ranks;
  n.ranks = {1, 2};
  n.world = 3;
  n.seconds = 0.01;
  n.other_seconds = 0.02;
  CHECK(report::note_text(n) ==
        "ranks 1, 2 left idle: the best plan over all 3 ranks is predicted at 20.00 ms a step against 10.00 ms "
        "without them (what they add, in communication or in the layouts all 3 ranks divide into, costs more "
        "than their compute gives)");
  n = PlanNote{};
  n.kind = NoteKind::uniform_baseline;
  n.stages = 2;
  n.seconds = 0.5;
  CHECK(report::note_text(n) == "equal batches, uniform layers over 2 stages (DeepSpeed): predicted step 500.00 ms, fits");
  n.problem = LayoutProblem{};
  n.problem->shortfall.rank = 1;
  n.problem->shortfall.device = "dev1";
  n.problem->shortfall.block_begin = 2;
  n.problem->shortfall.block_end = 4;
  CHECK(contains(report::note_text(n), "500.00 ms, does not fit (rank 1 (dev1, 0 B): 0 samples on blocks 2-3 need"));
  n = PlanNote{};
  n.kind = NoteKind::shape;
  n.stages = 2;
  n.replicas = 1;
  n.ranks_used = 2;
  n.world = 4;
  n.seconds = 0.25;
  CHECK(report::note_text(n) == "pipeline (2 stages) over the fastest 2: estimated step 250.00 ms");
  n.other_seconds = 0.26;  // the chosen plan's estimate, over more ranks: why this one was not taken
  CHECK(report::note_text(n) == "pipeline (2 stages) over the fastest 2: estimated step 250.00 ms, below the chosen "
                                "plan's estimate of 260.00 ms by less than the 10% that leaving ranks idle must gain");
  n.other_seconds = 0;
  n.ranks_used = n.world = 2;
  n.problem = LayoutProblem{};
  n.problem->kind = LayoutProblemKind::batch_below_replicas;
  n.problem->global_batch = 1;
  n.problem->replicas = 1;
  CHECK(contains(report::note_text(n), "pipeline (2 stages): ruled out: global batch 1 is smaller"));

  const NoPlanFits none("planner: no plan fits", 2, "synth:2xt4", "auto",
                        {{1, 2, 2, small_batch(2)}, {2, 1, 2, small_batch(1)}});
  CHECK(report::no_plan_text(none) ==
        "planner: no plan fits the cluster (2 ranks, synth:2xt4) with any layout, recomputation, micro-batching "
        "or optimizer sharding:\n  data (2 replicas): global batch 0 is smaller than its 2 data-parallel replicas "
        "(every replica needs a sample)\n  pipeline (2 stages): global batch 0 is smaller than its 1 data-parallel "
        "replicas (every replica needs a sample)");
  const NoPlanFits equal("planner: the equal split does not fit", 2, "synth:2xt4", "equal", {{1, 2, 2, LayoutProblem{}}});
  CHECK(contains(report::no_plan_text(equal), "planner: the equal split does not fit: rank 0 ("));
  CHECK(contains(report::no_plan_text(equal), "; strategy auto plans uneven shares and memory strategies"));
  const NoPlanFits data("planner: the global batch is smaller", 4, "synth:4xt4", "data", {{1, 4, 4, small_batch(4)}});
  CHECK(report::no_plan_text(data) ==
        "planner: global batch 0 is smaller than the 4 data-parallel replicas of strategy 'data' (every replica "
        "needs a sample); raise train.batch_size to at least 4 or use strategy auto or pipeline");
}

TEST_CASE("durations read in the unit of their size, a negative one (time gained) too") {
  CHECK(format_seconds(2.5e-4) == "250.0 µs");
  CHECK(format_seconds(0.0) == "0 s");
  CHECK(format_seconds(-0.0) == "0 s");
  CHECK(format_seconds(-2.495e-2) == "-24.95 ms");
  CHECK(format_seconds(0.5) == "500.00 ms");
  CHECK(format_seconds(-3.0) == "-3.00 s");
  // Past a million seconds an exponent, never a number cut short without its unit.
  CHECK(format_seconds(999999.0) == "999999.00 s");
  CHECK(format_seconds(1e70) == "1e+70 s");
  CHECK(format_seconds(-2.5e300) == "-2.5e+300 s");
  CHECK(format_bytes(1e308) == "9.31e+298 GiB");
}

TEST_CASE("ranks for people: runs of three or more as ranges, others one by one") {
  CHECK(join_ranks({}).empty());
  CHECK(join_ranks({3}) == "3");
  CHECK(join_ranks({1, 2}) == "1, 2");
  CHECK(join_ranks({0, 1, 2}) == "0-2");
  CHECK(join_ranks({0, 1, 2, 3, 5, 7, 8, 10, 11, 12}) == "0-3, 5, 7, 8, 10-12");
  std::vector<int> many(1536);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 2560 + static_cast<int>(i);
  CHECK(join_ranks(many) == "2560-4095");
}

TEST_CASE("plan report: a rank whose layout runs more micro-batches than memory asked for says so") {
  ht::plan::RankPlan r;
  r.micro_batches = 295;
  r.micro_batch_size = 1;
  r.memory_strategies = {ht::plan::MemoryStrategy::micro_batches};
  ht::plan::MemoryStep over;
  over.capacity = 1e9;
  ht::plan::MemoryStep step;
  step.kind = ht::plan::MemoryStepKind::micro_batches;
  step.micro_batches = 99;
  step.micro_batch_size = 3;
  r.memory_steps = {over, step};
  const std::string text = ht::report::memory_reason_text(r);
  CHECK(text.find("micro-batches: 99 of at most 3 samples") != std::string::npos);
  CHECK(text.find("; the layout then runs 295 micro-batches of at most 1 sample, within that bound") != std::string::npos);
  r.micro_batches = 99;  // as memory asked: nothing more to say
  r.micro_batch_size = 3;
  CHECK(ht::report::memory_reason_text(r).find("the layout runs") == std::string::npos);
}
