// Which backend a process computes on, from the config's device text and the process's
// MPI local rank (the caller reads it from the launcher; backend/ does not).
//
//   "cpu"     the CPU backend
//   "cuda:N"  GPU N; an error where there is no such GPU or the build has no CUDA backend
//   "cuda"    GPU (local rank mod the GPUs seen): one GPU per rank of a node
//   "auto"    "cuda" where a GPU is usable, else the CPU, with a note saying so
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
};
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

struct SelectedDevice {
  Backend* backend = nullptr;
  std::string note;
};
// parse_device, query_gpus, choose_device and backend_for in one.
SelectedDevice select_device(std::string_view text, int local_rank);

}  // namespace ht
