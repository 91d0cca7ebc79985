// Errors: one exception type whose message names the thing, the value and what was
// expected. Check macros build the message only on failure, so checks are cheap on
// hot paths.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ht {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Out-of-memory against a device's cap: a distinct type so callers (the planner's
// memory strategy, later) can react to it rather than parse text.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

template <class E = Error, class... Parts>
[[noreturn]] void fail_as(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  throw E(s.str());
}

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  fail_as<Error>(parts...);
}

}  // namespace ht

// HT_CHECK(cond, "op: what was wrong ", value, "; expected ...")
#define HT_CHECK(cond, ...)                     \
  do {                                          \
    if (!(cond)) [[unlikely]] ::ht::fail(__VA_ARGS__); \
  } while (0)
