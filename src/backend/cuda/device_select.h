// Which backend a process computes on, from the config's device text and the process's
// MPI local rank (the caller reads it from the launcher; backend/ does not).
//
//   "cpu"     the CPU backend
//   "cuda:N"  GPU N; an error where there is no such GPU, the build has no CUDA backend or
//             its module (hetrain-cuda.so) does not load
//   "cuda"    GPU (local rank mod the GPUs seen): one GPU per rank of a node
//   "auto"    "cuda" where a GPU is usable, else the CPU, with a note saying why
//
// The choice (choose_device) is a pure function of the request and of what the machine
// has, so that its messages are tested on any machine; select_device adds the query of
// the GPUs and the backend itself.
#pragma once

#include <string>
#include <string_view>

#include "backend/backend.h"
#include "core/device_request.h"  // DeviceRequest, parse_device: the forms a config accepts

namespace ht {

// What the machine offers: how many GPUs, or why none is usable.
struct GpuAvailability {
  bool backend_built = false;  // this build has the CUDA backend
  int count = 0;
  std::string why_none;  // set when count == 0: the runtime's reason
  // Set where the build has the backend but its module (hetrain-cuda.so) failed to load:
  // the file, dlerror() and what was expected. count is then 0.
  std::string module_error;
};
// Loads the CUDA backend module (backend/registry.h, cuda_module) where the build has it,
// and asks it for the GPUs.
GpuAvailability query_gpus();

struct DeviceChoice {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;     // the GPU, for kind == cuda
  std::string note;  // a line for the log: what auto chose and why; empty otherwise
};

// Throws ht::Error when the request cannot be met (cuda:N with no such GPU, a negative
// local rank), naming the request, what the machine has and what to do.
DeviceChoice choose_device(const DeviceRequest& request, int local_rank,
                           const GpuAvailability& gpus);

// The backend of a choice: cpu_backend() or the process's CUDA backend for that GPU,
// which it registers (backend/registry.h) at (cuda, index), together with the copy
// between two GPUs.
Backend& backend_for(const DeviceChoice& choice);

// train.precision against the chosen device. fp32 is taken anywhere. On the CPU a reduced
// precision is refused (one line naming the precision and the device), except that a
// device "auto" which fell back to the CPU falls back to fp32 with a note saying why. On a
// GPU, `gpu_refusal` is the backend's precision_refusal (empty: accepted): bf16 below
// sm_80 names the GPU and its capability; fp16 is taken on every GPU. Pure, for tests on any machine.
struct PrecisionChoice {
  Precision precision = Precision::fp32;
  std::string note;
};
PrecisionChoice choose_precision(Precision requested, const DeviceRequest& request,
                                 DeviceKind chosen, std::string_view gpu_refusal);

struct SelectedDevice {
  Backend* backend = nullptr;
  std::string note;  // device and precision notes, "; "-joined; empty when neither has one
  Precision precision = Precision::fp32;  // what the run computes in (choose_precision)
};
// parse_device, query_gpus, choose_device, backend_for and choose_precision in one. The
// backend's own precision is left as it is: the executor sets it for the steps
// (runtime/executor.cpp), so the probe before them times fp32 products.
SelectedDevice select_device(std::string_view text, int local_rank,
                             std::string_view precision = "fp32");

}  // namespace ht
