// What the SVG writers (plan_svg, what_if_svg) share: legend entries and text helpers.
#pragma once

#include <string>

#include "core/units.h"

namespace ht::report {

// A legend entry: the CSS class of its shapes, its label and its colour.
struct Swatch {
  const char* cls;
  const char* label;
  const char* colour;
};

// A coordinate: fixed precision keeps the bytes deterministic and the file small.
inline std::string px(double v) { return number("%.2f", v); }

// Text for an SVG element or attribute.
inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace ht::report
