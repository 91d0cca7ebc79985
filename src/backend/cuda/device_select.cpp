#include "backend/cuda/device_select.h"

#include "backend/registry.h"
#include "core/error.h"

#ifdef HETRAIN_HAVE_CUDA_BACKEND
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#endif

namespace ht {

namespace {

std::string quoted(std::string_view s) {
  std::string q(1, '"');
  q.append(s);
  q += '"';
  return q;
}

std::string gpu_range(int count) {
  return count == 1 ? "1 GPU (cuda:0)"
                    : std::to_string(count) + " GPUs (cuda:0 to cuda:" + std::to_string(count - 1) + ")";
}

}  // namespace

DeviceChoice choose_device(const DeviceRequest& req, int local_rank, const GpuAvailability& gpus) {
  HT_CHECK(local_rank >= 0, "device ", quoted(req.text), ": the local rank ", local_rank,
           " is negative; expected the process's rank among the ranks of its node, from 0");
  DeviceChoice c;
  if (req.kind == DeviceRequest::Kind::cpu) return c;
  const bool usable = gpus.backend_built && gpus.count > 0;
  const std::string reason =
      !gpus.backend_built ? std::string("this build of hetrain has no CUDA backend (configured "
                                        "without nvcc, cuBLAS and cuDNN, or with -Dcuda=disabled)")
                          : "no usable GPU on this machine (" + gpus.why_none + ")";
  if (req.kind == DeviceRequest::Kind::automatic && !usable) {
    c.note = "device \"auto\": " + reason + "; training on the CPU";
    return c;
  }
  if (!usable)
    fail("device ", quoted(req.text), ": ", reason, "; expected a machine with an NVIDIA GPU "
         "and its driver (nvidia-smi lists it), or device \"cpu\" or \"auto\"");
  c.kind = DeviceKind::cuda;
  if (req.index >= 0) {
    HT_CHECK(req.index < gpus.count, "device ", quoted(req.text), ": this machine has ",
             gpu_range(gpus.count), "; expected an index below ", gpus.count);
    c.index = req.index;
    return c;
  }
  c.index = local_rank % gpus.count;
  c.note = "device " + quoted(req.text) + ": cuda:" + std::to_string(c.index) + " (local rank " +
           std::to_string(local_rank) + " of a node with " + gpu_range(gpus.count) + ")";
  if (local_rank >= gpus.count)
    c.note += "; more ranks than GPUs on the node, so ranks share GPUs";
  return c;
}

GpuAvailability query_gpus() {
  GpuAvailability g;
#ifdef HETRAIN_HAVE_CUDA_BACKEND
  g.backend_built = true;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // cudaErrorInsufficientDriver where no driver is loaded, cudaErrorNoDevice where it
    // sees no GPU: both mean no usable GPU, not a failure.
    cudaGetLastError();
    g.why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return g;
  }
  g.count = count;
  if (count == 0) g.why_none = "cudaGetDeviceCount: 0 devices";
#endif
  return g;
}

#ifdef HETRAIN_HAVE_CUDA_BACKEND
namespace {

// GPU to GPU without the host. The source's work is finished first (its values are
// computed); the copy runs on the destination's compute stream, after the work already
// issued there (the caching allocator may hand out a block that work still reads), and
// is waited for, so that the source block may be freed and reused at once.
bool cuda_peer_copy(Backend& dst_be, void* dst, Backend& src_be, const void* src, size_t bytes) {
  auto* d = dynamic_cast<cuda::CudaBackend*>(&dst_be);
  auto* s = dynamic_cast<cuda::CudaBackend*>(&src_be);
  if (d == nullptr || s == nullptr) return false;
  s->synchronize();
  const std::string where = s->device_name() + " to " + d->device_name();
  HT_CUDA_ON(where, cudaMemcpyPeerAsync(dst, d->device(), src, s->device(), bytes, d->compute_stream()));
  HT_CUDA_ON(where, cudaStreamSynchronize(d->compute_stream()));
  return true;
}

}  // namespace
#endif

Backend& backend_for(const DeviceChoice& choice) {
  if (choice.kind == DeviceKind::cpu) return cpu_backend();
#ifdef HETRAIN_HAVE_CUDA_BACKEND
  Backend& be = cuda::cuda_backend(choice.index);
  register_backend(DeviceKind::cuda, choice.index, be);
  set_peer_copy(cuda_peer_copy);
  return be;
#else
  fail("cuda:", choice.index, ": this build of hetrain has no CUDA backend; expected a choice "
       "made by choose_device");
#endif
}

PrecisionChoice choose_precision(Precision requested, const DeviceRequest& req,
                                 DeviceKind chosen, std::string_view gpu_refusal) {
  PrecisionChoice c;
  if (requested == Precision::fp32) return c;
  const std::string name = precision_name(requested);
  const std::string needs = requested == Precision::bf16 ? "a CUDA device (sm_80+)" : "a CUDA device";
  if (chosen == DeviceKind::cpu) {
    if (req.kind == DeviceRequest::Kind::automatic) {
      c.note = "train.precision " + name + ": device \"auto\" chose the CPU, which computes in "
               "fp32 only; training in fp32";
      return c;
    }
    fail("train.precision ", name, " needs ", needs, "; this run's device is cpu");
  }
  if (!gpu_refusal.empty()) fail("train.precision ", name, ": ", gpu_refusal);
  c.precision = requested;
  return c;
}

SelectedDevice select_device(std::string_view text, int local_rank, std::string_view precision) {
  DeviceRequest req = parse_device(text);
  const Precision wanted = parse_precision(precision);
  GpuAvailability gpus = req.kind == DeviceRequest::Kind::cpu ? GpuAvailability{} : query_gpus();
  DeviceChoice choice = choose_device(req, local_rank, gpus);
  Backend& be = backend_for(choice);
  PrecisionChoice p = choose_precision(wanted, req, choice.kind,
                                       choice.kind == DeviceKind::cpu ? std::string() : be.precision_refusal(wanted));
  std::string note = choice.note;
  if (!p.note.empty()) note += (note.empty() ? "" : "; ") + p.note;
  return {&be, note, p.precision};
}

}  // namespace ht
