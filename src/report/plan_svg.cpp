#include "report/plan_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/units.h"
#include "report/svg_text.h"

namespace ht::report {

namespace {

// Horizontal layout: rank labels on the left, both sections share one x range, and the
// memory bars' "used / capacity" labels go to the right of it.
constexpr double kWidth = 1100, kPlotLeft = 190, kPlotRight = 950;
constexpr double kPlotWidth = kPlotRight - kPlotLeft;
// Below this lane height a label would overlap its neighbours'.
constexpr double kMinLabelledLane = 8;

constexpr Swatch kActivities[] = {{"compute", "compute", "#4C78A8"},
                                  {"comm", "communication", "#F58518"},
                                  {"idle", "idle (waiting for a peer)", "#D9D9D9"}};
// In stacking order, the order of plan::MemoryUse.
constexpr Swatch kMemoryKinds[] = {{"params", "parameters", "#54A24B"},
                                   {"grads", "gradients", "#B279A2"},
                                   {"optimizer", "optimizer state", "#EECA3B"},
                                   {"activations", "activations", "#72B7B2"}};
constexpr const char* kOverColour = "#D62728";


struct TimeUnit {
  double scale;
  const char* name;
};

TimeUnit time_unit(double seconds) {
  if (seconds < 1e-3) return {1e-6, "µs"};
  if (seconds < 1) return {1e-3, "ms"};
  return {1, "s"};
}

// 1, 2 or 5 x 10^k: between 4 and 9 ticks over [0, end].
double tick_step(double end) {
  const double raw = end / 8;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * magnitude >= raw) return m * magnitude;
  return 10 * magnitude;
}

// Up to this many ranks every rank has a lane; past it a lane stands for a run of
// consecutive ranks that the plan gives the same device, stage, layers, share and
// memory, drawn as its first rank (1,024 ranks were lanes of 3 px and 3 MB of rects no one
// could read, 4,096 of 2 px and 12 MB).
constexpr size_t kLanesPerRank = 64;

struct Lane {
  int first = 0, last = 0;  // ranks; `first` is drawn
  size_t index = 0;         // its entry in plan.ranks
};

bool same_lane(const plan::RankPlan& a, const plan::RankPlan& b) {
  return b.rank == a.rank + 1 && a.device.id == b.device.id && a.stage == b.stage &&
         (a.replica < 0) == (b.replica < 0) && a.block_begin == b.block_begin && a.block_end == b.block_end &&
         a.samples == b.samples && a.micro_batches == b.micro_batches && a.micro_batch_size == b.micro_batch_size &&
         a.memory.total() == b.memory.total() && a.device.memory_bytes == b.device.memory_bytes;
}

std::vector<Lane> lanes_of(const plan::Plan& plan) {
  std::vector<Lane> lanes;
  const bool merge = plan.ranks.size() > kLanesPerRank;
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    if (merge && !lanes.empty() && same_lane(plan.ranks[i - 1], plan.ranks[i]))
      lanes.back().last = plan.ranks[i].rank;
    else
      lanes.push_back({plan.ranks[i].rank, plan.ranks[i].rank, i});
  }
  return lanes;
}

struct Geometry {
  double lane;  // height per lane, the same in both sections
  double timeline_top, timeline_bottom, memory_top, height;
  double time_end;  // seconds at the right end of the time axis
  TimeUnit unit;
  bool labels() const { return lane >= kMinLabelledLane; }
  double font() const { return std::min(11.0, lane - 1); }
  double x(double t) const { return kPlotLeft + t / time_end * kPlotWidth; }
};

Geometry geometry(const plan::Plan& plan, const std::vector<Lane>& lanes, const std::vector<Span>& timeline) {
  Geometry g;
  const double ranks = static_cast<double>(std::max<size_t>(lanes.size(), 1));
  // Small worlds get readable lanes; large ones shrink to keep each section near 600 px.
  g.lane = std::clamp(std::floor(600 / ranks), 2.0, 18.0);
  g.timeline_top = 72;
  g.timeline_bottom = g.timeline_top + ranks * g.lane;
  g.memory_top = g.timeline_bottom + 48;
  g.height = g.memory_top + ranks * g.lane + 16 + (lanes.size() < plan.ranks.size() ? 18 : 0);  // the lanes' note
  g.time_end = plan.predicted.step_seconds;
  for (const Span& s : timeline) g.time_end = std::max(g.time_end, s.end_s);
  if (g.time_end <= 0) g.time_end = 1e-3;  // nothing to draw; keep the axis finite
  g.unit = time_unit(g.time_end);
  return g;
}

std::string rect(const std::string& attributes, const std::string& title = "") {
  if (title.empty()) return "<rect " + attributes + "/>\n";
  return "<rect " + attributes + "><title>" + xml_escape(title) + "</title></rect>\n";
}

std::string text(double x, double y, const std::string& body, const std::string& extra = "") {
  return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\"" + extra + ">" + xml_escape(body) +
         "</text>\n";
}

std::string legend(double y, std::span<const Swatch> swatches, bool with_over) {
  std::string out = "<g class=\"legend\">\n";
  double x = kPlotLeft;
  auto item = [&](const std::string& fill, const std::string& stroke, const char* label) {
    out += rect("x=\"" + px(x) + "\" y=\"" + px(y - 9) + "\" width=\"10\" height=\"10\" fill=\"" +
                fill + "\" stroke=\"" + stroke + "\"");
    out += text(x + 14, y, label);
    x += 28 + 6.5 * static_cast<double>(std::strlen(label));  // about 6.5 px a character
  };
  for (const Swatch& sw : swatches) item(sw.colour, "none", sw.label);
  if (with_over) item("none", kOverColour, "over capacity");
  return out + "</g>\n";
}

// One text per lane at `x`, centred on it; none when lanes are too thin to read.
template <class TextOf>
std::string lane_texts(const plan::Plan& plan, const std::vector<Lane>& lanes, const Geometry& g, double top,
                       double x, const std::string& attributes, TextOf text_of) {
  if (!g.labels()) return "";
  std::string out = "<g font-size=\"" + px(g.font()) + "\"" + attributes + ">\n";
  for (size_t i = 0; i < lanes.size(); ++i) {
    const double y = top + static_cast<double>(i) * g.lane + g.lane / 2 + g.font() * 0.35;
    out += text(x, y, text_of(plan.ranks[lanes[i].index], lanes[i]));
  }
  return out + "</g>\n";
}

std::string lane_name(const plan::RankPlan& r, const Lane& l) {
  return (l.first == l.last ? "rank " + std::to_string(l.first)
                            : "ranks " + std::to_string(l.first) + "-" + std::to_string(l.last)) +
         " " + r.device.id;
}

// "rank N device" (or "ranks A-B device") beside each lane, clipped to the label column so
// long names cannot run into the bars.
std::string lane_labels(const plan::Plan& plan, const std::vector<Lane>& lanes, const Geometry& g, double top) {
  return lane_texts(plan, lanes, g, top, 4, " clip-path=\"url(#label-column)\"", lane_name);
}

std::string usage_text(const plan::RankPlan& r) {
  return format_bytes(r.memory.total()) + " / " + format_bytes(r.device.memory_bytes);
}

std::string time_axis(const Geometry& g) {
  std::string out = "<g class=\"axis\" text-anchor=\"middle\">\n";
  const double step = tick_step(g.time_end);
  for (int i = 0; i * step <= g.time_end * (1 + 1e-9); ++i) {
    const double t = i * step, x = g.x(t);
    out += "<line x1=\"" + px(x) + "\" y1=\"" + px(g.timeline_top - 4) + "\" x2=\"" + px(x) +
           "\" y2=\"" + px(g.timeline_bottom) + "\" stroke=\"#E5E5E5\"/>\n";
    out += text(x, g.timeline_top - 8, number("%g", t / g.unit.scale) + " " + g.unit.name);
  }
  return out + "</g>\n";
}

const Swatch& checked_swatch(const Span& s, size_t index, size_t ranks) {
  HT_CHECK(s.rank >= 0 && static_cast<size_t>(s.rank) < ranks, "plan_to_svg: span ", index,
           " (", s.name, ") has rank ", s.rank, "; the plan has ", ranks, " ranks");
  HT_CHECK(s.end_s >= s.start_s, "plan_to_svg: span ", index, " (", s.name, " on rank ",
           s.rank, ") ends at ", s.end_s, " s before it starts at ", s.start_s, " s");
  for (const Swatch& sw : kActivities)
    if (s.category == sw.cls) return sw;
  fail("plan_to_svg: span ", index, " (", s.name, ") has category '", s.category,
       "'; expected compute, comm or idle");
}

std::string span_title(const Span& s, const TimeUnit& unit) {
  std::string title = "rank " + std::to_string(s.rank) + ": " + s.name;
  if (s.micro_batch >= 0) title += " mb=" + std::to_string(s.micro_batch);
  if (s.stage >= 0) title += " stage=" + std::to_string(s.stage);
  return title + " " + number("%.3f", s.start_s / unit.scale) + "–" +
         number("%.3f", s.end_s / unit.scale) + " " + unit.name;
}

std::string spans(const plan::Plan& plan, const std::vector<Lane>& lanes, const std::vector<Span>& timeline,
                  const Geometry& g) {
  std::vector<int> lane_of(plan.ranks.size(), -1);  // the lane a rank is drawn in (-1: another's stands for it)
  for (size_t i = 0; i < lanes.size(); ++i)
    if (lanes[i].first >= 0 && static_cast<size_t>(lanes[i].first) < lane_of.size())
      lane_of[static_cast<size_t>(lanes[i].first)] = static_cast<int>(i);
  // A hairline between neighbouring spans tells back-to-back micro-batches apart, where
  // lanes are tall enough to spare it.
  std::string out = g.labels() ? "<g stroke=\"#FFFFFF\" stroke-width=\"0.5\">\n" : "<g>\n";
  for (size_t i = 0; i < timeline.size(); ++i) {
    const Span& s = timeline[i];
    const Swatch& sw = checked_swatch(s, i, plan.ranks.size());
    const int lane = lane_of[static_cast<size_t>(s.rank)];
    if (s.end_s <= s.start_s || lane < 0) continue;
    const double y = g.timeline_top + lane * g.lane + g.lane * 0.1;
    out += rect("class=\"" + std::string(sw.cls) + "\" x=\"" + px(g.x(s.start_s)) + "\" y=\"" +
                    px(y) + "\" width=\"" + px(g.x(s.end_s) - g.x(s.start_s)) +
                    "\" height=\"" + px(g.lane * 0.8) + "\" fill=\"" + sw.colour + "\"",
                span_title(s, g.unit));
  }
  return out + "</g>\n";
}

// The capacity as a grey bar (outlined where lanes are tall enough for a line to show),
// the four kinds stacked over it, and a red outline on top when they exceed it.
std::string memory_bar(const plan::RankPlan& r, const Lane& l, const Geometry& g, double top, double scale) {
  const std::string vertical =
      "\" y=\"" + px(top + g.lane * 0.1) + "\" height=\"" + px(g.lane * 0.8) + "\"";
  const std::string capacity_width = " width=\"" + px(r.device.memory_bytes * scale) + "\"";
  std::string out = rect("class=\"capacity\" x=\"" + px(kPlotLeft) + vertical + capacity_width +
                             " fill=\"#EEEEEE\"" +
                             (g.labels() ? " stroke=\"#333333\" stroke-width=\"1\"" : ""),
                         lane_name(r, l) + ": " + usage_text(r) + (l.first == l.last ? "" : " each"));
  const double kinds[] = {r.memory.params, r.memory.grads, r.memory.optimizer,
                          r.memory.activations};
  double x = kPlotLeft;
  for (size_t k = 0; k < 4; ++k) {
    if (kinds[k] <= 0) continue;
    out += rect("class=\"" + std::string(kMemoryKinds[k].cls) + "\" x=\"" + px(x) + vertical +
                " width=\"" + px(kinds[k] * scale) + "\" fill=\"" + kMemoryKinds[k].colour + "\"");
    x += kinds[k] * scale;
  }
  if (r.memory.total() > r.device.memory_bytes)
    out += rect("class=\"over\" x=\"" + px(kPlotLeft) + vertical + capacity_width +
                " fill=\"none\" stroke=\"" + kOverColour + "\" stroke-width=\"2\"");
  return out;
}

// Every bar shares one scale, so capacities compare across ranks.
std::string memory_bars(const plan::Plan& plan, const std::vector<Lane>& lanes, const Geometry& g) {
  double largest = 1;
  for (const plan::RankPlan& r : plan.ranks)
    largest = std::max({largest, r.device.memory_bytes, r.memory.total()});
  std::string out;
  for (size_t i = 0; i < lanes.size(); ++i)
    out += memory_bar(plan.ranks[lanes[i].index], lanes[i], g,
                      g.memory_top + static_cast<double>(i) * g.lane, kPlotWidth / largest);
  return out;
}

std::string title(const plan::Plan& plan) {
  const TimeUnit unit = time_unit(plan.predicted.step_seconds);
  return text(8, 22,
              plan.config_name + ": " + plan::to_string(plan.strategy) + ", predicted step " +
                  number("%.2f", plan.predicted.step_seconds / unit.scale) + " " + unit.name +
                  ", " + number("%.2fx", plan.speedup) + " over the baseline",
              " font-size=\"16\"");
}

}  // namespace

std::string plan_to_svg(const plan::Plan& plan, const std::vector<Span>& timeline) {
  // Spans are checked against every rank, drawn or not, before anything is drawn.
  for (size_t i = 0; i < timeline.size(); ++i) (void)checked_swatch(timeline[i], i, plan.ranks.size());
  const std::vector<Lane> lanes = lanes_of(plan);
  const Geometry g = geometry(plan, lanes, timeline);
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + px(kWidth) +
         "\" height=\"" + px(g.height) + "\" viewBox=\"0 0 " + px(kWidth) + " " + px(g.height) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  out += "<defs><clipPath id=\"label-column\"><rect x=\"0\" y=\"0\" width=\"" +
         px(kPlotLeft - 6) + "\" height=\"" + px(g.height) + "\"/></clipPath></defs>\n";
  out += rect("width=\"100%\" height=\"100%\" fill=\"white\"");
  out += title(plan);
  const std::string what = plan.local ? "one round (" + std::to_string(plan.local->inner_steps) + " job steps), predicted"
                                      : std::string("one step, predicted");
  out += text(8, g.timeline_top - 30, what, " font-weight=\"bold\"");
  out += legend(g.timeline_top - 30, kActivities, false);
  out += time_axis(g);
  out += lane_labels(plan, lanes, g, g.timeline_top);
  out += spans(plan, lanes, timeline, g);
  out += text(8, g.memory_top - 14, "memory per rank", " font-weight=\"bold\"");
  out += legend(g.memory_top - 14, kMemoryKinds, true);
  out += lane_labels(plan, lanes, g, g.memory_top);
  out += memory_bars(plan, lanes, g);
  out += lane_texts(plan, lanes, g, g.memory_top, kPlotRight + 6, "",
                    [](const plan::RankPlan& r, const Lane& l) { return usage_text(r) + (l.first == l.last ? "" : " each"); });
  if (lanes.size() < plan.ranks.size())
    out += text(8, g.height - 6,
                std::to_string(plan.ranks.size()) + " ranks in " + std::to_string(lanes.size()) +
                    " lanes: a lane is a run of ranks with the same device, stage, layers, share and memory, "
                    "drawn as its first rank");
  return out + "</svg>\n";
}

}  // namespace ht::report
