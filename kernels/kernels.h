// Every CUDA kernel launcher, for host code compiled by g++ (src/backend/cuda): the
// family headers hold host declarations only (no device code), so this header needs
// just the CUDA runtime API and the backend interface.
//
// Each launcher has the name and parameters of the Backend virtual it implements, plus
// a trailing cudaStream_t; it enqueues work on that stream and returns. The contract:
// - No launcher synchronises, and none checks for launch errors: the caller reads
//   cudaGetLastError / the stream's status where it checks CUDA calls.
// - Device-side conditions never throw. cross_entropy, embedding and embedding_backward
//   take `int* error_flag` (device memory) before the stream and store 1 there when a
//   label or id is out of range; the caller clears the flag beforehand, reads it back
//   later and raises the error the CPU backend raises.
// - Host-side conditions do throw ht::Error: a strided copy, binary or where whose view
//   keeps more than 8 dimensions after merging the dense ones, and an attention head
//   larger than kAttentionMaxHead.
// - Sums, maxima, softmax, layer norm, col2im, maxpool2d_backward and attention are
//   deterministic (fixed reduction order, no atomics). embedding_backward adds with
//   atomicAdd, so its sums over repeated ids may differ in the last bits between runs.
// - Every launcher accepts empty sizes and then enqueues nothing, except where an empty
//   sum still writes its zeros (reduce sum over n == 0, layernorm_backward over no rows).
#pragma once

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "kernels/attention.cuh"
#include "kernels/dropout.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/optim.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rowwise.cuh"
#include "kernels/window.cuh"
