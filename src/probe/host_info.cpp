#include "probe/host_info.h"

#include <hwloc.h>
#include <unistd.h>

#include "backend/backend.h"
#include "probe/gpu_query.h"

namespace ht::probe {

namespace {

// hwloc describes the machine as this process sees it (cgroup cpusets included).
void read_topology(HostInfo& info) {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return;
  if (hwloc_topology_load(topo) == 0) {
    info.physical_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    info.hardware_threads = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
    const char* model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : nullptr;
    if (!model) model = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topo), "CPUModel");
    if (model) info.cpu_model = model;
  }
  hwloc_topology_destroy(topo);
}

}  // namespace

HostInfo read_host_info() {
  HostInfo info;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) info.host = name;
  read_topology(info);
  if (info.cpu_model.empty()) info.cpu_model = "unknown CPU";
  MemoryInfo mem = cpu_backend().memory_info();
  info.memory_total = mem.total;
  info.memory_available = mem.available;
  info.gpus = query_gpus(info.gpu_note);
  return info;
}

}  // namespace ht::probe
