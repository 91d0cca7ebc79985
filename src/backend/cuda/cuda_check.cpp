#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace ht::cuda {

namespace {

std::string where(const std::string& device) { return device.empty() ? "" : " on " + device; }

const char* hint(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return "the device is out of memory; lower the batch or the micro-batch, or let the "
             "planner see the device's memory (hetrain probe)";
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      return "no usable GPU here; check that nvidia-smi lists one and that the driver is at "
             "least as new as the CUDA runtime, or use device \"cpu\" or \"auto\"";
    case cudaErrorInvalidDevice:
      return "the device index is beyond the GPUs this process sees (CUDA_VISIBLE_DEVICES "
             "narrows them)";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorUnsupportedPtxVersion:
      return "this binary has no code for this GPU's architecture; rebuild with "
             "-Dgpu_arch=all or -Dgpu_arch=native";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
      return "a kernel read or wrote outside its buffers (a bug in hetrain; "
             "compute-sanitizer names the kernel); the CUDA context is unusable now";
    case cudaErrorLaunchTimeout:
      return "a kernel ran past the display watchdog; use a GPU that drives no display";
    case cudaErrorInvalidConfiguration:
      return "a kernel was launched with a bad grid or block size (a bug in hetrain's "
             "launcher for this op)";
    default:
      return "see the CUDA runtime's description above";
  }
}

const char* hint(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLAS could not start; check the driver and that the device has free memory";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "cuBLAS ran out of device memory for its workspace; lower the batch";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "a dimension, leading dimension or stride was out of range (a bug in the "
             "caller's GemmArgs)";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "this GPU lacks a feature the call needs";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GEMM kernel failed on the device; an earlier kernel may have faulted";
    default:
      return "see cuBLAS's description above";
  }
}

const char* hint(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "cuDNN could not start; check that libcudnn matches the CUDA runtime";
    case CUDNN_STATUS_BAD_PARAM:
      return "a tensor or convolution descriptor was inconsistent (a bug in the caller)";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "cuDNN has no algorithm for this configuration on this GPU";
    default:
      return "see cuDNN's description above";
  }
}

std::string compose(const char* call, const std::string& device, const std::string& what,
                    const char* advice) {
  return std::string(call) + " failed" + where(device) + ": " + what + "; HINT: " + advice;
}

}  // namespace

std::string describe(cudaError_t e, const char* call, const std::string& device) {
  return compose(call, device,
                 std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")", hint(e));
}

std::string describe(cublasStatus_t s, const char* call, const std::string& device) {
  return compose(call, device,
                 std::string(cublasGetStatusString(s)) + " (" + cublasGetStatusName(s) + ")",
                 hint(s));
}

std::string describe(cudnnStatus_t s, const char* call, const std::string& device) {
  return compose(call, device, cudnnGetErrorString(s), hint(s));
}

void check(cudaError_t e, const char* call, const std::string& device) {
  if (e != cudaSuccess) [[unlikely]] {
    // Taken off the runtime's last error: a caller that catches this (a non-sticky failure,
    // an allocation say) would otherwise see it again as the next launch's own.
    cudaGetLastError();
    throw Error(describe(e, call, device));
  }
}

void check(cublasStatus_t s, const char* call, const std::string& device) {
  if (s != CUBLAS_STATUS_SUCCESS) [[unlikely]] throw Error(describe(s, call, device));
}

void check(cudnnStatus_t s, const char* call, const std::string& device) {
  if (s != CUDNN_STATUS_SUCCESS) [[unlikely]] throw Error(describe(s, call, device));
}

void check_launch(const char* op, const std::string& device) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) [[likely]]
    return;
  std::string message = describe(e, (std::string("the ") + op + " kernel launch").c_str(), device);
  // These errors are sticky and kernels run asynchronously: the fault is usually an earlier
  // kernel's or copy's, only seen at this launch.
  if (e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorMisalignedAddress)
    message += " (the fault may be an earlier kernel's or copy's, seen at this launch: run with "
               "CUDA_LAUNCH_BLOCKING=1 to stop at the one that faulted)";
  throw Error(message);
}

}  // namespace ht::cuda
