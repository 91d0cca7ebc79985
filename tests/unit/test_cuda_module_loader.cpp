// The CUDA module loader's checks, on this machine without a GPU: a module built against
// other backend headers (fake_cuda_module.cpp) is refused before any of its table is used.
#include <doctest/doctest.h>

#include <string>

#include "backend/cuda/cuda_module.h"
#include "backend/registry.h"
#include "module_interface_hash.h"

#ifndef HETRAIN_FAKE_CUDA_MODULE
#error "HETRAIN_FAKE_CUDA_MODULE: the path of the fake module (tests/unit/meson.build)"
#endif

TEST_CASE("cuda module loader: a module of this interface version but another interface hash is refused, naming both") {
  std::string why;
  CHECK(ht::open_cuda_module(HETRAIN_FAKE_CUDA_MODULE, why) == nullptr);
  char mine[24], theirs[24];
  std::snprintf(mine, sizeof mine, "%016llx", static_cast<unsigned long long>(ht::cuda::kModuleInterfaceHash));
  std::snprintf(theirs, sizeof theirs, "%016llx", static_cast<unsigned long long>(ht::cuda::kModuleInterfaceHash ^ 1));
  CHECK_MESSAGE(why.find(std::string("interface hash ") + theirs + "; this hetrain's is " + mine) != std::string::npos,
                why);
  CHECK_MESSAGE(why.find("rebuild both from one") != std::string::npos, why);
}
