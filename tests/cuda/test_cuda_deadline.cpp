// parallel.sync deadline on a GPU rank: the reduction's messages live in host memory, so a
// contribution is copied out of device memory and the step's sum back into it.
#include <doctest/doctest.h>

#include "backend/cuda/cuda_backend.h"
#include "tests/harness/deadline_one_member.h"

TEST_CASE("cuda deadline: a GPU rank's gradients go out through host memory and their sum comes back") {
  ht::harness::check_one_member_deadline(ht::cuda::cuda_backend(0));  // the CPU's twin: tests/unit
}
