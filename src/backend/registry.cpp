#include "backend/registry.h"

#include <mutex>
#include <vector>

#include "core/error.h"

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

}  // namespace ht
