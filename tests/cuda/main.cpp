// The cuda suite's entry point: doctest's main where a GPU is usable, else exit 77 so that
// meson reports the suite as skipped, with the reason.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "backend/cuda/device_select.h"

int main(int argc, char** argv) {
  constexpr int kMesonSkip = 77;
  ht::GpuAvailability gpus = ht::query_gpus();
  if (!gpus.backend_built) {
    std::printf("SKIP: this build has no CUDA backend\n");
    return kMesonSkip;
  }
  if (gpus.count == 0) {
    std::printf("SKIP: no usable GPU (%s)\n", gpus.why_none.c_str());
    return kMesonSkip;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
