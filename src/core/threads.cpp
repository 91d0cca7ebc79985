#include "core/threads.h"

#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/thread_pool.h"

extern "C" void openblas_set_num_threads(int);

namespace ht {

namespace {
int env_positive(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  HT_CHECK(*end == '\0' && n > 0 && n < 4096, "environment variable ", name, "='", v,
           "' is not a thread count; expected an integer from 1 to 4095");
  return static_cast<int>(n);
}
}  // namespace

int resolve_thread_count(int requested, int ranks_on_node) {
  if (requested > 0) return requested;
  if (int n = env_positive("OMP_NUM_THREADS")) return n;
  if (int n = env_positive("OPENBLAS_NUM_THREADS")) return n;
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (ranks_on_node > 1) cores /= ranks_on_node;
  return cores > 0 ? cores : 1;
}

void set_thread_count(int n) {
  HT_CHECK(n > 0, "thread count ", n, " is invalid; expected at least 1");
  openblas_set_num_threads(n);
  set_pool_threads(n);
}

}  // namespace ht
