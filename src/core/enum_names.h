// The one way an enum meets text: a table of (value, name) pairs per enum, read in both
// directions. Files and messages use the names; code compares the values.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ht {

template <class E>
using EnumName = std::pair<E, const char*>;

template <class E, size_t N>
const char* enum_name(E value, const EnumName<E> (&table)[N]) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "?";
}

template <class E, size_t N>
std::optional<E> enum_from_name(std::string_view name, const EnumName<E> (&table)[N]) {
  for (const auto& [v, n] : table)
    if (name == n) return v;
  return std::nullopt;
}

// In table order: the choices a reader lists when a name is not among them.
template <class E, size_t N>
std::vector<std::string> enum_names(const EnumName<E> (&table)[N]) {
  std::vector<std::string> out;
  for (const auto& entry : table) out.emplace_back(entry.second);
  return out;
}

}  // namespace ht
