#include "report/what_if_svg.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "core/error.h"
#include "core/units.h"
#include "report/svg_text.h"

namespace ht::report {

namespace {

using plan::WhatIfKind;
using plan::WhatIfSpanKind;

constexpr double kWidth = 1100;
constexpr double kEventRow = 14;   // one row of event labels per event (up to kEventRows)
constexpr size_t kEventRows = 12;  // more events share rows: labels may overlap, marks do not move
constexpr double kBandGap = 26;    // room for a band's name above it


// Indexed by WhatIfSpanKind.
constexpr Swatch kSpans[] = {{"work", "steps as planned", "#4C78A8"},
                             {"held", "held by a stall", "#E45756"},
                             {"waiting", "waiting for a late group", "#D9D9D9"},
                             {"short", "closed short", "#F58518"},
                             {"restart", "restart", "#9D755D"},
                             {"lost", "work lost (redone)", "url(#lost)"}};
// Indexed by WhatIfKind.
constexpr Swatch kEvents[] = {{"stall", "stall", "#C0392B"},
                              {"slow", "slow from T", "#8E44AD"},
                              {"fail", "failure", "#000000"},
                              {"link", "link change", "#27AE60"},
                              {"join", "join", "#1F77B4"}};

const Swatch& span_swatch(WhatIfSpanKind k) { return kSpans[static_cast<size_t>(k)]; }
const Swatch& event_swatch(WhatIfKind k) { return kEvents[static_cast<size_t>(k)]; }


std::string text(double x, double y, const std::string& body, const std::string& extra = "") {
  return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\"" + extra + ">" + xml_escape(body) + "</text>\n";
}

std::string titled(const std::string& element, const std::string& attributes, const std::string& title) {
  return "<" + element + " " + attributes + "><title>" + xml_escape(title) + "</title></" + element + ">\n";
}

// 1, 2 or 5 x 10^k: between 4 and 9 ticks over [0, end].
double tick_step(double end) {
  const double raw = end / 8;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * magnitude >= raw) return m * magnitude;
  return 10 * magnitude;
}

struct Band {
  const plan::PolicyOutcome* outcome;
  double top = 0, lane = 0;
  size_t lanes = 1;
  double bottom() const { return top + static_cast<double>(lanes) * lane; }
};

}  // namespace

double what_if_svg_end(const plan::WhatIfResult& result, const std::vector<plan::WhatIfEvent>& events) {
  double end = 0;
  for (const plan::PolicyOutcome& p : result.policies)
    if (p.refused.empty()) end = std::max(end, p.seconds);
  for (const plan::WhatIfEvent& e : events) end = std::max(end, e.at_s + (e.kind == WhatIfKind::stall ? e.for_s : 0));
  return end > 0 ? end : 1;  // nothing played: keep the axis finite
}

std::string what_if_to_svg(const plan::WhatIfResult& result, const std::vector<plan::WhatIfEvent>& events,
                           const std::string& title) {
  const double end = what_if_svg_end(result, events);
  const auto x = [&](double t) { return kWhatIfPlotLeft + t / end * kWhatIfPlotWidth; };
  const double events_top = 84;
  const double events_bottom = events_top + kEventRow * static_cast<double>(std::min(events.size(), kEventRows)) + 6;
  std::vector<Band> bands;
  double y = events_bottom + kBandGap;
  for (const plan::PolicyOutcome& p : result.policies) {
    Band b{&p};
    b.lanes = std::max<size_t>(p.lanes.size(), 1);
    // A few lanes are readable; many (local at hundreds of groups) shrink to keep the band near 120 px.
    b.lane = std::clamp(std::floor(120 / static_cast<double>(b.lanes)), 2.0, 18.0);
    b.top = y;
    y = b.bottom() + kBandGap;
    bands.push_back(b);
  }
  const double plot_bottom = bands.empty() ? events_bottom : bands.back().bottom();
  const double height = plot_bottom + 24;

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + px(kWidth) + "\" height=\"" +
         px(height) + "\" viewBox=\"0 0 " + px(kWidth) + " " + px(height) +
         "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  out += "<defs><pattern id=\"lost\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
         "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#FFFFFF\" fill-opacity=\"0.35\"/>"
         "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#D62728\" stroke-width=\"3\"/></pattern>"
         "<clipPath id=\"label-column\"><rect x=\"0\" y=\"0\" width=\"" +
         px(kWhatIfPlotLeft - 6) + "\" height=\"" + px(height) + "\"/></clipPath></defs>\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += text(8, 22, title, " font-size=\"16\"");

  // The legend: the spans' kinds, then the events' marks.
  out += "<g class=\"legend\">\n";
  double lx = 8;
  const auto item = [&](const std::string& mark, const char* label) {
    out += mark;
    out += text(lx + 14, 50, label);
    lx += 28 + 6.2 * static_cast<double>(std::strlen(label));
  };
  for (const Swatch& s : kSpans)
    item("<rect x=\"" + px(lx) + "\" y=\"41\" width=\"10\" height=\"10\" fill=\"" + s.colour +
             "\" stroke=\"#999999\" stroke-width=\"0.5\"/>\n",
         s.label);
  for (const Swatch& s : kEvents)
    item("<line x1=\"" + px(lx + 5) + "\" y1=\"40\" x2=\"" + px(lx + 5) + "\" y2=\"52\" stroke=\"" + s.colour +
             "\" stroke-width=\"2\"/>\n",
         s.label);
  out += "</g>\n";

  // The time axis, its grid over every band.
  out += "<g class=\"axis\" text-anchor=\"middle\">\n";
  const double step = tick_step(end);
  for (int i = 0; i * step <= end * (1 + 1e-9); ++i) {
    const double t = i * step;
    out += "<line x1=\"" + px(x(t)) + "\" y1=\"" + px(events_top - 4) + "\" x2=\"" + px(x(t)) + "\" y2=\"" +
           px(plot_bottom) + "\" stroke=\"#E5E5E5\"/>\n";
    out += text(x(t), events_top - 8, format_seconds(t));
  }
  out += "</g>\n";
  out += text(8, events_top + 10, "events", " font-weight=\"bold\"");

  // The bands: each policy's lanes and spans; the work lost over what it covers.
  for (const Band& b : bands) {
    const plan::PolicyOutcome& p = *b.outcome;
    const std::string name = config::to_string(p.policy);
    out += "<g class=\"band\" data-policy=\"" + name + "\">\n";
    out += text(8, b.top - 8, name + (p.refused.empty() ? ": " + format_seconds(p.seconds) + " to the " +
                                                              std::to_string(result.steps) + " steps, " +
                                                              format_seconds(p.lost_seconds) + " lost to the events"
                                                        : ""),
                " font-weight=\"bold\"");
    if (!p.refused.empty()) {
      out += text(kWhatIfPlotLeft, b.top + b.lane * 0.75, "not simulated: " + p.refused, " fill=\"#666666\"");
      out += "</g>\n";
      continue;
    }
    if (b.lane >= 8) {
      out += "<g clip-path=\"url(#label-column)\" font-size=\"" + px(std::min(11.0, b.lane - 1)) + "\">\n";
      for (size_t l = 0; l < p.lanes.size(); ++l)
        out += text(20, b.top + static_cast<double>(l) * b.lane + b.lane / 2 + 4, p.lanes[l]);
      out += "</g>\n";
    }
    const auto draw = [&](int lane, double start, double stop, WhatIfSpanKind kind, const std::string& what) {
      const Swatch& sw = span_swatch(kind);
      out += titled("rect",
                    "class=\"span " + std::string(sw.cls) + "\" x=\"" + px(x(start)) + "\" y=\"" +
                        px(b.top + lane * b.lane + b.lane * 0.1) + "\" width=\"" + px(x(stop) - x(start)) +
                        "\" height=\"" + px(b.lane * 0.8) + "\" fill=\"" + sw.colour + "\"",
                    what + " " + format_seconds(start) + " to " + format_seconds(stop));
    };
    // Spans narrower than a pixel (a wait every round, at hundreds of rounds) are drawn
    // as runs about 2 px wide, in the colour of the kind that takes most of the run.
    struct Run {
      double start = 0, stop = 0;
      double seconds[std::size(kSpans)] = {};
      int spans = 0;
    };
    std::vector<Run> runs(b.lanes);
    const auto flush = [&](int lane) {
      Run& r = runs[static_cast<size_t>(lane)];
      if (r.spans == 0) return;
      const auto most = static_cast<size_t>(std::max_element(std::begin(r.seconds), std::end(r.seconds)) - r.seconds);
      draw(lane, r.start, r.stop, static_cast<WhatIfSpanKind>(most),
           r.spans == 1 ? std::string(kSpans[most].label) : std::to_string(r.spans) + " spans, mostly " + kSpans[most].label);
      r = Run{};
    };
    for (const plan::WhatIfSpan& s : p.timeline) {
      HT_CHECK(s.lane >= 0 && static_cast<size_t>(s.lane) < b.lanes && s.end >= s.start, "what_if_to_svg: ", name,
               " span on lane ", s.lane, " from ", s.start, " s to ", s.end, " s; the band has ", b.lanes, " lanes");
      if (s.kind == WhatIfSpanKind::lost) continue;
      Run& r = runs[static_cast<size_t>(s.lane)];
      if (r.spans > 0 && x(s.start) - x(r.stop) > 0.5) flush(s.lane);  // not contiguous
      if (x(s.end) - x(s.start) >= 1) {
        flush(s.lane);
        draw(s.lane, s.start, s.end, s.kind, span_swatch(s.kind).label);
        continue;
      }
      if (r.spans == 0) r.start = s.start;
      r.stop = s.end;
      r.seconds[static_cast<size_t>(s.kind)] += s.end - s.start;
      ++r.spans;
      if (x(r.stop) - x(r.start) >= 2) flush(s.lane);
    }
    for (size_t l = 0; l < b.lanes; ++l) flush(static_cast<int>(l));
    for (const plan::WhatIfSpan& s : p.timeline)  // the work lost last, over what it redid
      if (s.kind == WhatIfSpanKind::lost) draw(s.lane, s.start, s.end, s.kind, span_swatch(s.kind).label);
    out += "</g>\n";
  }

  // The events, over the bands: each at its time, its label in its row.
  out += "<g class=\"events\">\n";
  for (size_t i = 0; i < events.size(); ++i) {
    const plan::WhatIfEvent& e = events[i];
    const Swatch& sw = event_swatch(e.kind);
    const double row = events_top + kEventRow * static_cast<double>(i % kEventRows);
    const std::string attrs = "class=\"event-mark " + std::string(sw.cls) + "\" data-event=\"" + std::to_string(i) +
                              "\" x1=\"" + px(x(e.at_s)) + "\" y1=\"" + px(row) + "\" x2=\"" + px(x(e.at_s)) +
                              "\" y2=\"" + px(plot_bottom) + "\" stroke=\"" + sw.colour + "\" stroke-width=\"1.5\"" +
                              (e.kind == WhatIfKind::link || e.kind == WhatIfKind::join ? " stroke-dasharray=\"4 2\"" : "");
    out += titled("line", attrs, e.spec);
    switch (e.kind) {
      case WhatIfKind::stall:  // its span, in its row and faintly over the bands
        out += "<rect class=\"event-span stall\" data-event=\"" + std::to_string(i) + "\" x=\"" + px(x(e.at_s)) +
               "\" y=\"" + px(row) + "\" width=\"" + px(x(e.at_s + e.for_s) - x(e.at_s)) + "\" height=\"" +
               px(plot_bottom - row) + "\" fill=\"" + sw.colour + "\" fill-opacity=\"0.12\"/>\n";
        break;
      case WhatIfKind::slow:  // from T to the end of the axis
        out += "<line class=\"event-span slow\" data-event=\"" + std::to_string(i) + "\" x1=\"" + px(x(e.at_s)) +
               "\" y1=\"" + px(row + 5) + "\" x2=\"" + px(x(end)) + "\" y2=\"" + px(row + 5) + "\" stroke=\"" +
               sw.colour + "\" stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n";
        break;
      case WhatIfKind::fail:
        out += "<path class=\"event-cross\" d=\"M" + px(x(e.at_s) - 4) + " " + px(row + 1) + " l8 8 m0 -8 l-8 8\" "
               "stroke=\"" + sw.colour + "\" stroke-width=\"2\"/>\n";
        break;
      case WhatIfKind::link:
      case WhatIfKind::join: break;
    }
    // Right of the mark, or left of it in the axis' last third, so that it stays on the page.
    const bool left = x(e.at_s) > kWhatIfPlotLeft + kWhatIfPlotWidth * 2 / 3;
    out += text(x(e.at_s) + (left ? -5 : 5), row + 10, e.spec,
                " fill=\"" + std::string(sw.colour) + "\"" + (left ? " text-anchor=\"end\"" : ""));
  }
  out += "</g>\n";
  return out + "</svg>\n";
}

}  // namespace ht::report
