// How many threads this process computes with. Several MPI ranks on one node must
// share its cores rather than each take all of them.
#pragma once

namespace ht {

// Resolution order: `requested` (> 0), then OMP_NUM_THREADS, then OPENBLAS_NUM_THREADS,
// then the node's cores divided by `ranks_on_node` (comm::Communicator::local_size()),
// at least 1.
int resolve_thread_count(int requested = 0, int ranks_on_node = 1);

// Applies the count to OpenBLAS and to the engine's own parallel loops.
void set_thread_count(int n);

}  // namespace ht
