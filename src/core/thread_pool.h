// The engine's own worker threads for its parallel loops.
//
// Why not OpenMP: libgomp's idle workers spin for a while after every parallel region,
// and OpenBLAS (pthreads build) runs its own workers; interleaving our loops with
// gemm calls then made two busy teams fight over the cores (a 500-step MLP run took
// 9.0 s on 2 threads against 3.1 s on 1). libgomp's wait policy is fixed from the
// environment before main() runs. These workers block on a condition variable when
// idle, so they never take a core from OpenBLAS or from another rank on the node.
#pragma once

#include <cstdint>
#include <functional>

namespace ht {

// Runs fn(chunk) for every chunk in [0, chunks) on the pool's threads and the calling
// thread, returning when all are done. Chunks are handed out dynamically, and the caller
// never waits for a worker that has not started one: on busy cores (ranks sharing them)
// a late worker costs nothing, where waiting for every worker to check in made a
// 3750-step run 20x slower. A call made
// from inside a running task (nested parallelism) runs serially on that thread. fn must
// not throw: the kernels check their inputs before they split the work.
void parallel_chunks(int64_t chunks, const std::function<void(int64_t)>& fn);

// Threads that parallel_chunks uses, the caller included (>= 1).
int pool_threads();
void set_pool_threads(int n);

}  // namespace ht
