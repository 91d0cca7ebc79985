// Helpers shared by the MPI suite's test files.
#pragma once

#include <chrono>

#include "comm/communicator.h"
#include "core/wall_time.h"

namespace mpi_test {

using namespace std::chrono_literals;

using ht::seconds_since;

// Generous: a test that fails on one rank must not leave the others hanging for long.
constexpr auto kLong = 30s;

}  // namespace mpi_test
