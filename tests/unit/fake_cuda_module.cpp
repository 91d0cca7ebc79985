// A stand-in for hetrain-cuda.so whose table has this build's interface version but
// another interface hash, as a module built against other backend headers would: the
// loader must refuse it (test_cuda_module_loader.cpp). Only its entry point is defined.
#include "backend/cuda/cuda_module.h"
#include "module_interface_hash.h"

extern "C" const ht::cuda::ModuleApi* hetrain_cuda_module() {
  static const ht::cuda::ModuleApi api = [] {
    ht::cuda::ModuleApi a;
    a.abi = ht::cuda::kModuleAbi;
    a.interface_hash = ht::cuda::kModuleInterfaceHash ^ 1;
    return a;
  }();
  return &api;
}
