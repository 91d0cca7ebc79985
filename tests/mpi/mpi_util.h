// Helpers shared by the MPI suite's test files.
#pragma once

#include <chrono>

#include "comm/communicator.h"

namespace mpi_test {

using namespace std::chrono_literals;

inline double seconds_since(ht::comm::Clock::time_point t0) {
  return std::chrono::duration<double>(ht::comm::Clock::now() - t0).count();
}

// Generous: a test that fails on one rank must not leave the others hanging for long.
constexpr auto kLong = 30s;

}  // namespace mpi_test
