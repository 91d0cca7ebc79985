// Checks one OpCase. Each returns a report; `ok` is false with a description when a
// check fails, so a test can print exactly which op and which input went wrong.
#pragma once

#include <string>

#include "backend/backend.h"
#include "tests/harness/op_case.h"

namespace ht::harness {

struct Report {
  bool ok = true;
  double worst = 0.0;  // the largest normalised error seen
  std::string detail;
};

// Forward on `be` against the double-precision reference.
Report check_forward(const OpCase& c, Backend& be, uint64_t seed = 1);
// Gradients on `be` (backward of sum(out * w) for a random w) against central finite
// differences of the reference, in double precision.
Report check_gradients(const OpCase& c, Backend& be, uint64_t seed = 1);
// Forward and gradients on `be` against the CPU backend, same inputs.
Report check_against_cpu(const OpCase& c, Backend& be, uint64_t seed = 1);

// Normalised max error: max|got - want| / max(max|want|, 0.01). The floor keeps
// near-zero outputs from turning float32 rounding into large relative errors.
double normalized_error(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace ht::harness
