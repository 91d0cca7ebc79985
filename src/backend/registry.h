// The process's backends by device, and the run's device.
//
// A backend is found by its kind and index: the CPU is (cpu, 0), always present; a GPU's
// backend is registered by device selection (backend/cuda/device_select.h) when it is
// first made. The run's device is the one this process computes on: set once, where a run
// starts (runtime::train, from the config's "device" through select_device). Code that
// makes tensors for computation takes a Backend& from its caller or from a tensor it
// already has; the one place a run starts asks for run_device() by name. Until it is set
// the run's device is the CPU, as with "device": "cpu" (unit tests and tools that never
// select one compute on the CPU).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "backend/backend.h"

namespace ht {

namespace cuda {
struct ModuleApi;  // backend/cuda/cuda_module.h
}

// Makes `backend` the one found at (kind, index). Registering a second backend at a
// taken place throws; registering the same one again does nothing.
void register_backend(DeviceKind kind, int index, Backend& backend);
// The backend at (kind, index), or null where none is registered.
Backend* find_backend(DeviceKind kind, int index);
// The same, throwing ht::Error naming the device and those registered where there is none.
Backend& backend_at(DeviceKind kind, int index);
// (kind, index) of a registered backend; throws where `backend` was never registered.
std::pair<DeviceKind, int> device_of(const Backend& backend);
// "cpu", "cuda:0": the device's name as the config spells it.
std::string device_name(const Backend& backend);

// Sets the run's device. Setting it again to the same backend does nothing; to another
// throws (tensors already made on the first would be stranded there).
void set_run_device(Backend& backend);
Backend& run_device();

// Copies `bytes` of dense data from `src` on `src_backend` to `dst` on `dst_backend`:
// within one backend by its own copy, host to device and back by the device's copy from
// or to the host, between two devices by the peer copy registered for them (GPU to GPU)
// or else through a host buffer. Returns when `dst` holds the values and `src` may be
// freed.
void copy_between(Backend& dst_backend, void* dst, Backend& src_backend, const void* src,
                  size_t bytes);

// A direct copy between two non-host backends: returns false where it does not apply to
// that pair (copy_between then stages through the host). The CUDA backend's is
// registered with its first backend.
using PeerCopy = std::function<bool(Backend& dst_backend, void* dst, Backend& src_backend,
                                    const void* src, size_t bytes)>;
void set_peer_copy(PeerCopy copy);

// The CUDA backend module (backend/cuda/cuda_module.h), loaded the first time a GPU is
// asked for and kept to the process's end: the module linked into the program where it is
// (the cuda test suite), else hetrain-cuda.so from $HETRAIN_CUDA_MODULE when set, else from
// the directory of the running executable (/proc/self/exe). Null where it cannot be had,
// with `why` set: the build has no CUDA backend, or the file, dlerror() and what was
// expected. Thread-safe; the first call's answer is every call's.
const cuda::ModuleApi* cuda_module(std::string& why);
// The module where an earlier cuda_module() loaded it, else null with `why` set (no CUDA
// backend in the build, the load's error, or that no GPU was asked for yet), without
// loading it: for what only reports GPUs (the probe's host facts), which a CPU rank should
// not pay the module's memory for.
const cuda::ModuleApi* loaded_cuda_module(std::string& why);
// The file cuda_module() would load ($HETRAIN_CUDA_MODULE, else beside the executable).
std::string cuda_module_path();
// dlopen()s the module at `path` and checks its entry point and version, uncached: the
// loading behind cuda_module(), for tests of its errors. Null with `why` set on failure;
// a module once opened stays loaded.
const cuda::ModuleApi* open_cuda_module(const std::string& path, std::string& why);

}  // namespace ht
