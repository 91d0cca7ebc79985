#include "comm/launch.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>

namespace ht::comm {

namespace {
// A whole number >= 0 as the variable holds it; -1 where unset or not one.
int whole(const char* v) {
  if (v == nullptr || *v == '\0') return -1;
  int out = 0;
  const char* end = v + std::strlen(v);
  const auto [p, ec] = std::from_chars(v, end, out);
  return ec == std::errc() && p == end && out >= 0 ? out : -1;
}
}  // namespace

Launch launch_from(const std::function<const char*(const char*)>& env) {
  Launch l;
  const int ompi_size = whole(env("OMPI_COMM_WORLD_SIZE"));
  const int pmix_rank = whole(env("PMIX_RANK")), pmi_rank = whole(env("PMI_RANK"));
  if (ompi_size > 0) {  // mpirun
    l.launched = true;
    l.size = ompi_size;
    l.rank = std::max(0, whole(env("OMPI_COMM_WORLD_RANK")));
    return l;
  }
  if (pmix_rank < 0 && pmi_rank < 0) return l;  // no launcher: a world of one
  // srun, or another PMI launcher: MPI_Init finds the world through PMI.
  l.launched = true;
  l.rank = pmix_rank >= 0 ? pmix_rank : pmi_rank;
  const int pmi_size = whole(env("PMI_SIZE")), slurm_tasks = whole(env("SLURM_NTASKS"));
  l.size = pmi_size > 0 ? pmi_size : slurm_tasks > 0 ? slurm_tasks : 0;
  return l;
}

Launch launch() {
  return launch_from([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

}  // namespace ht::comm
