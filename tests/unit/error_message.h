// Shared by the unit tests that check error messages.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "core/error.h"

// The message of the ht::Error that `f` throws; a test failure (and "") when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ht::Error& e) {
    return e.what();
  }
  FAIL_CHECK("expected an ht::Error; none was thrown");
  return "";
}

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
