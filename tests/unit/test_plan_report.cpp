// The plan's two views: the terminal table (`hetrain plan`) and the SVG picture, on a
// hand-made four-rank data-parallel plan whose every field is known.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "error_message.h"
#include "plan/plan.h"
#include "report/plan_svg.h"
#include "report/plan_table.h"
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
  p.ranks[0].link_note = "1 Gb/s to every other rank";
  p.ranks[1].recompute = true;
  p.ranks[1].memory_strategy = kStrategyRecompute;
  p.ranks[1].memory_reason = "needs 13.5 GiB of 12.0 GiB; recompute saves 3.0 GiB";
  p.predicted = {0.1, 1280, 0.05};
  p.baseline.predicted = {0.2, 640, 0.1};
  p.baseline.fits = false;
  p.baseline.problems = {"rank 1 (rtx3060): needs 15.5 GiB of 12.0 GiB, 3.5 GiB short"};
  p.speedup = 2.0;
  p.notes = {"rank 0 takes half of every batch"};
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
  CHECK(contains(out, "baseline does not fit:\n  rank 1 (rtx3060): needs 15.5 GiB"));
  CHECK(contains(out, "speed-up over baseline: 2.00x"));
  CHECK(contains(out, "rank 1: recompute: needs 13.5 GiB of 12.0 GiB; recompute saves"));
  // A reason that starts with its strategy does not repeat it.
  Plan sharded = sample_plan();
  sharded.ranks[2].memory_strategy = kStrategySharding;
  sharded.ranks[2].memory_reason = "optimizer sharding: keeps 40.0% of stage 0's optimizer state, sharded for rank 3";
  CHECK(contains(report::format_plan(sharded), "rank 2: optimizer sharding: keeps 40.0%"));
  CHECK_FALSE(contains(report::format_plan(sharded), "optimizer sharding: optimizer sharding"));
  CHECK(contains(out, "rank 0: 1 Gb/s to every other rank"));
  CHECK(contains(out, "  - rank 0 takes half of every batch"));
  CHECK(contains(out, "candidates evaluated: 12"));
  for (size_t at = 0, end; (end = out.find('\n', at)) != std::string::npos; at = end + 1) {
    CHECK(end - at <= 120);  // fits a 120-column terminal
    CHECK((end == at || out[end - 1] != ' '));  // no trailing blanks
  }
}

TEST_CASE("plan report: format_plan merges consecutive identical ranks only") {
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

  // Equal reasons with a rank between them that has none stay apart.
  p = sample_plan();
  p.ranks[3].memory_strategy = p.ranks[1].memory_strategy;
  p.ranks[3].memory_reason = p.ranks[1].memory_reason;
  const std::string apart = report::format_plan(p);
  CHECK(contains(apart, "\n  rank 1: recompute: "));
  CHECK(contains(apart, "\n  rank 3: recompute: "));
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
  CHECK(contains(svg, "<title>ReduceGrads stage=0 20.000–30.000 ms</title>"));
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

TEST_CASE("plan report: svg of a large world keeps every rect and drops lane labels") {
  Plan p = sample_plan();
  p.ranks.clear();
  std::vector<Span> timeline;
  for (int i = 0; i < 1024; ++i) {
    p.ranks.push_back(rank(i, "h100", 80, 128, 8, 0.7));
    timeline.push_back({i, "Forward", "compute", 0.0, 0.05, 0, 0});
  }
  const std::string svg = report::plan_to_svg(p, timeline);
  CHECK(occurrences(svg, "class=\"compute\"") == 1024);
  CHECK(occurrences(svg, "class=\"capacity\"") == 1024);
  // 2 px lanes: each rank has a span and five memory rects (capacity, four kinds).
  CHECK(occurrences(svg, " height=\"1.60\"") == 6 * 1024);
  CHECK_FALSE(contains(svg, ">rank 5 h100<"));
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
