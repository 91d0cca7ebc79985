#include "backend/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_module.h"
#include "module_interface_hash.h"  // generated: src/backend/meson.build
#include "core/error.h"

// The module's entry point where the program links the module in; weak, so that hetrain,
// which does not, leaves it null and loads the module instead.
extern "C" const ht::cuda::ModuleApi* hetrain_cuda_module() __attribute__((weak));

namespace ht {

namespace {

struct Entry {
  DeviceKind kind;
  int index;
  Backend* backend;
};

struct Registry {
  Registry() : entries{{DeviceKind::cpu, 0, &cpu_backend()}} {}
  std::mutex mu;
  std::vector<Entry> entries;
  Backend* run = nullptr;
  PeerCopy peer;
};

std::string place(DeviceKind kind, int index) {
  return kind == DeviceKind::cpu ? std::string("cpu") : std::string(to_string(kind)) + ":" + std::to_string(index);
}

// The CPU is registered when the registry is made, so lookups never miss it.
Registry& registry() {
  static Registry r;
  return r;
}

Entry* find_locked(Registry& r, DeviceKind kind, int index) {
  for (Entry& e : r.entries)
    if (e.kind == kind && e.index == index) return &e;
  return nullptr;
}

const Entry* find_locked(Registry& r, const Backend& backend) {
  for (const Entry& e : r.entries)
    if (e.backend == &backend) return &e;
  return nullptr;
}

std::string registered_locked(Registry& r) {
  std::string s;
  for (const Entry& e : r.entries) s += (s.empty() ? "" : ", ") + place(e.kind, e.index);
  return s;
}

}  // namespace

void register_backend(DeviceKind kind, int index, Backend& backend) {
  HT_CHECK(index >= 0, "register_backend: device index ", index, " for ", to_string(kind),
           "; expected >= 0");
  HT_CHECK(backend.kind() == kind, "register_backend: the ", backend.name(), " backend is a ",
           to_string(backend.kind()), " device; expected one of kind ", to_string(kind));
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (Entry* e = find_locked(r, kind, index)) {
    HT_CHECK(e->backend == &backend, "register_backend: ", place(kind, index),
             " already has a backend (", e->backend->name(), "); expected one backend per device");
    return;
  }
  r.entries.push_back({kind, index, &backend});
}

Backend* find_backend(DeviceKind kind, int index) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Entry* e = find_locked(r, kind, index);
  return e ? e->backend : nullptr;
}

Backend& backend_at(DeviceKind kind, int index) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Entry* e = find_locked(r, kind, index);
  if (!e)
    fail("device ", place(kind, index), ": no backend is registered for it; this process has ",
         registered_locked(r), " (a GPU's backend is made by device selection, select_device)");
  return *e->backend;
}

std::pair<DeviceKind, int> device_of(const Backend& backend) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const Entry* e = find_locked(r, backend);
  HT_CHECK(e != nullptr, "device_of: the ", backend.name(),
           " backend is not registered; this process has ", registered_locked(r));
  return {e->kind, e->index};
}

std::string device_name(const Backend& backend) {
  auto [kind, index] = device_of(backend);
  return place(kind, index);
}

void set_run_device(Backend& backend) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const Entry* e = find_locked(r, backend);
  HT_CHECK(e != nullptr, "set_run_device: the ", backend.name(),
           " backend is not registered; expected one of ", registered_locked(r));
  if (r.run != nullptr && r.run != &backend) {
    const Entry* now = find_locked(r, *r.run);
    fail("set_run_device: the run's device is already ", place(now->kind, now->index),
         "; expected it set once, not moved to ", place(e->kind, e->index),
         " (tensors already made there would be stranded)");
  }
  r.run = &backend;
}

Backend& run_device() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.run ? *r.run : cpu_backend();
}

void set_peer_copy(PeerCopy copy) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.peer = std::move(copy);
}

void copy_between(Backend& dst_be, void* dst, Backend& src_be, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (&dst_be == &src_be) {
    // One flat run of 4-byte elements (both dtypes are 4 bytes wide).
    HT_CHECK(bytes % 4 == 0, "copy_between: ", bytes, " bytes on ", src_be.name(),
             "; expected whole 4-byte elements");
    const int64_t n = static_cast<int64_t>(bytes / 4);
    src_be.copy(src, {1}, dst, {1}, {n});
    return;
  }
  if (src_be.kind() == DeviceKind::cpu) {
    dst_be.copy_from_host(dst, src, bytes);
    return;
  }
  if (dst_be.kind() == DeviceKind::cpu) {
    src_be.copy_to_host(dst, src, bytes);
    return;
  }
  PeerCopy peer;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    peer = r.peer;
  }
  if (peer && peer(dst_be, dst, src_be, src, bytes)) return;
  std::vector<unsigned char> host(bytes);
  src_be.copy_to_host(host.data(), src, bytes);
  dst_be.copy_from_host(dst, host.data(), bytes);
}

namespace {

const cuda::ModuleApi* checked(const cuda::ModuleApi* api, const std::string& where, std::string& why) {
  if (api == nullptr) {
    why = where + ": its entry point hetrain_cuda_module() returned null; expected the module's table";
    return nullptr;
  }
  if (api->abi != cuda::kModuleAbi) {
    why = where + " is a CUDA module of interface version " + std::to_string(api->abi) +
          "; this hetrain expects version " + std::to_string(cuda::kModuleAbi) +
          " (the module and the executable come from different builds; rebuild both from one tree)";
    return nullptr;
  }
  if (api->interface_hash != cuda::kModuleInterfaceHash) {
    char mine[24], theirs[24];
    std::snprintf(mine, sizeof mine, "%016llx", static_cast<unsigned long long>(cuda::kModuleInterfaceHash));
    std::snprintf(theirs, sizeof theirs, "%016llx", static_cast<unsigned long long>(api->interface_hash));
    why = where + " was built against other backend headers (interface hash " + theirs + "; this hetrain's is " +
          mine + "): the module and the executable come from different states of the tree; rebuild both from one";
    return nullptr;
  }
  return api;
}

struct ModuleState {
  std::mutex mu;
  bool tried = false;
  const cuda::ModuleApi* api = nullptr;
  std::string why;
};

ModuleState& module_state() {
  static ModuleState s;
  return s;
}

}  // namespace

std::string cuda_module_path() {
  const char* env = std::getenv(cuda::kModuleEnv);
  if (env != nullptr && env[0] != '\0') return env;
  std::string exe(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size());
  if (n <= 0 || static_cast<size_t>(n) >= exe.size()) return cuda::kModuleFile;
  exe.resize(static_cast<size_t>(n));
  const size_t slash = exe.rfind('/');
  return (slash == std::string::npos ? std::string() : exe.substr(0, slash + 1)) + cuda::kModuleFile;
}

const cuda::ModuleApi* open_cuda_module(const std::string& path, std::string& why) {
  // RTLD_NOW: a symbol the executable does not provide is named here, not at a first call
  // in the middle of a run. RTLD_LOCAL: the module's symbols stay its own.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    why = "the CUDA backend module " + path + " could not be loaded: " + (e ? e : "unknown dlopen error") +
          "; expected " + cuda::kModuleFile + " of this build beside the hetrain executable, or its path in " +
          cuda::kModuleEnv;
    return nullptr;
  }
  dlerror();
  void* entry = dlsym(handle, "hetrain_cuda_module");
  if (entry == nullptr) {
    const char* e = dlerror();
    why = path + " has no entry point hetrain_cuda_module (" + (e ? e : "dlsym found null") +
          "); expected hetrain's CUDA backend module, " + cuda::kModuleFile;
    dlclose(handle);
    return nullptr;
  }
  using Entry = const cuda::ModuleApi* (*)();
  const cuda::ModuleApi* api = checked(reinterpret_cast<Entry>(entry)(), path, why);
  // A refused module is closed; an accepted one stays loaded, as its backends live to the
  // process's end.
  if (api == nullptr) dlclose(handle);
  return api;
}

const cuda::ModuleApi* cuda_module(std::string& why) {
  ModuleState& s = module_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.tried) {
    s.tried = true;
#ifdef HETRAIN_HAVE_CUDA_BACKEND
    if (hetrain_cuda_module != nullptr)
      s.api = checked(hetrain_cuda_module(), "the CUDA backend linked into this program", s.why);
    else
      s.api = open_cuda_module(cuda_module_path(), s.why);
#else
    s.why = "this build of hetrain has no CUDA backend (configured without nvcc, cuBLAS and cuDNN, or with "
            "-Dcuda=disabled)";
#endif
  }
  if (s.api == nullptr) why = s.why;
  return s.api;
}

const cuda::ModuleApi* loaded_cuda_module(std::string& why) {
  ModuleState& s = module_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.api != nullptr) return s.api;
#ifdef HETRAIN_HAVE_CUDA_BACKEND
  why = s.tried ? s.why
                : std::string("not listed: this process asked for no GPU, and hetrain loads its CUDA "
                              "backend (") + cuda::kModuleFile + ") only for one";
#else
  why = "no GPU support in this build (CUDA not found at configure time)";
#endif
  return nullptr;
}

}  // namespace ht
