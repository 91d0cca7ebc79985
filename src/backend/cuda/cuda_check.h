// Checks for every CUDA runtime, cuBLAS and cuDNN call of the backend. A failure throws
// ht::Error naming the call as written, the library's error string and a hint at the
// likely cause, in the manner of llm.c's HINT lines:
//
//   cudaMalloc(&p, bytes) failed on cuda:0: out of memory (cudaErrorMemoryAllocation);
//   HINT: ...
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

namespace ht::cuda {

// Each throws ht::Error when `status` is not success; `call` is the call's text and
// `device` names where it ran ("cuda:0"), or is empty before a device is chosen.
void check(cudaError_t status, const char* call, const std::string& device);
void check(cublasStatus_t status, const char* call, const std::string& device);
void check(cudnnStatus_t status, const char* call, const std::string& device);

// The message check() throws, without throwing (tests and callers that only warn).
std::string describe(cudaError_t status, const char* call, const std::string& device);
std::string describe(cublasStatus_t status, const char* call, const std::string& device);
std::string describe(cudnnStatus_t status, const char* call, const std::string& device);

// After an ht::kernels launcher: a launch that failed (bad configuration, no kernel image
// for this GPU) is reported by cudaGetLastError, naming the op.
void check_launch(const char* op, const std::string& device);

}  // namespace ht::cuda

// HT_CUDA_ON("cuda:0", cudaMalloc(&p, n)); the status type picks the library. Inside a
// member of a class with a device_name() (the backend), HT_CUDA(call).
#define HT_CUDA_ON(device, call) ::ht::cuda::check((call), #call, (device))
#define HT_CUDA(call) HT_CUDA_ON(device_name(), call)
