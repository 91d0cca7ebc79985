// The messages of the CUDA, cuBLAS and cuDNN checks: the call, the library's error string
// and a hint. None needs a GPU.
#include <doctest/doctest.h>

#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

using namespace ht;

TEST_CASE("cuda check: a CUDA error names the call, the device, the error and a hint") {
  std::string msg = cuda::describe(cudaErrorMemoryAllocation, "cudaMalloc(&p, bytes)", "cuda:1");
  CHECK(msg.find("cudaMalloc(&p, bytes) failed on cuda:1: ") == 0);
  CHECK(msg.find(cudaGetErrorString(cudaErrorMemoryAllocation)) != std::string::npos);
  CHECK(msg.find("(cudaErrorMemoryAllocation)") != std::string::npos);
  CHECK(msg.find("HINT: the device is out of memory") != std::string::npos);
  std::string arch = cuda::describe(cudaErrorNoKernelImageForDevice, "launch", "");
  CHECK(arch.find("launch failed: ") == 0);  // no device named before one is chosen
  CHECK(arch.find("-Dgpu_arch=") != std::string::npos);
}

TEST_CASE("cuda check: cuBLAS and cuDNN statuses are spelled by their libraries") {
  std::string blas = cuda::describe(CUBLAS_STATUS_INVALID_VALUE, "cublasSgemm(...)", "cuda:0");
  CHECK(blas.find("cublasSgemm(...) failed on cuda:0: ") == 0);
  CHECK(blas.find("(CUBLAS_STATUS_INVALID_VALUE)") != std::string::npos);
  CHECK(blas.find("HINT: a dimension") != std::string::npos);
  std::string dnn = cuda::describe(CUDNN_STATUS_BAD_PARAM, "cudnnSetTensor4dDescriptor(...)", "cuda:0");
  CHECK(dnn.find(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)) != std::string::npos);
  CHECK(dnn.find("HINT: ") != std::string::npos);
}

TEST_CASE("cuda check: success passes and a failure throws the described message") {
  CHECK_NOTHROW(cuda::check(cudaSuccess, "cudaFree(p)", "cuda:0"));
  CHECK_NOTHROW(cuda::check(CUBLAS_STATUS_SUCCESS, "cublasCreate(&h)", "cuda:0"));
  CHECK_THROWS_WITH_AS(HT_CUDA_ON("cuda:0", cudaErrorInvalidDevice),
                       cuda::describe(cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "cuda:0").c_str(),
                       Error);
  CHECK_THROWS_AS(cuda::check(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate(&h)", "cuda:0"), Error);
  CHECK_THROWS_AS(cuda::check(CUDNN_STATUS_NOT_SUPPORTED, "cudnnConvolutionForward", "cuda:0"), Error);
}
