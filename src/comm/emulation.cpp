#include "comm/emulation.h"

#include <cstdio>
#include <cstdlib>

#include "backend/backend.h"

namespace ht::comm {

namespace {

// tools/hetero-local's per-rank cap, in bytes.
size_t env_memory_cap() {
  const char* v = std::getenv("HETRAIN_MEMORY_CAP");
  if (!v || !*v) return 0;
  char* end = nullptr;
  unsigned long long bytes = std::strtoull(v, &end, 10);
  HT_CHECK(*end == '\0' && bytes > 0, "environment variable HETRAIN_MEMORY_CAP='", v,
           "' is not a byte count; expected a positive integer");
  return static_cast<size_t>(bytes);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string mib(size_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

std::vector<std::string> apply_emulation(const config::EmulateConfig& e, Communicator& comm) {
  std::vector<std::string> notes;
  std::vector<LinkEmulation> links(comm.size());
  bool any_link = false;
  size_t cap = env_memory_cap();
  for (size_t i = 0; i < e.ranks.size(); ++i) {
    const config::RankEmulation& r = e.ranks[i];
    if (r.rank >= comm.size())
      throw config::ConfigError("emulate.ranks[" + std::to_string(i) + "].rank: " +
                                std::to_string(r.rank) + " is not a rank of this " +
                                std::to_string(comm.size()) + "-rank job; expected 0 to " +
                                std::to_string(comm.size() - 1));
    links[r.rank] = {r.latency_ms / 1e3, r.bandwidth_mb_s * 1e6};
    any_link = any_link || links[r.rank].active();
    if (r.rank == comm.rank() && r.memory_cap_mb > 0) {
      size_t c = static_cast<size_t>(r.memory_cap_mb) << 20;
      cap = cap ? std::min(cap, c) : c;
    }
  }
  const LinkEmulation& mine = links[comm.rank()];
  if (mine.latency_s > 0) notes.push_back("link latency +" + number(mine.latency_s * 1e3) + " ms (emulated)");
  if (mine.bandwidth_bytes_per_s > 0)
    notes.push_back("link bandwidth " + number(mine.bandwidth_bytes_per_s / 1e6) + " MB/s (emulated)");
  if (any_link) comm.set_link_emulation(links);
  if (cap) {
    cpu_backend().allocator().set_cap(cap);
    notes.push_back("memory cap " + mib(cap) + " (emulated)");
  }
  return notes;
}

}  // namespace ht::comm
