#include "backend/cuda/device_select.h"

#include <charconv>

#include "core/error.h"

#ifdef HETRAIN_HAVE_CUDA_BACKEND
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#endif

namespace ht {

namespace {

constexpr const char* kForms = "expected \"cpu\", \"cuda\", \"cuda:N\" (N a GPU index) or \"auto\"";

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

DeviceRequest parse_device(std::string_view text) {
  DeviceRequest r;
  r.text = std::string(text);
  if (text == "cpu") return r;
  if (text == "auto") {
    r.kind = DeviceRequest::Kind::automatic;
    return r;
  }
  if (text == "cuda") {
    r.kind = DeviceRequest::Kind::cuda;
    return r;
  }
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0)
      fail("device ", quoted(text), ": the GPU index ", quoted(digits),
           " is not a whole number from 0; ", kForms);
    r.kind = DeviceRequest::Kind::cuda;
    r.index = index;
    return r;
  }
  fail("device ", quoted(text), " is not a device; ", kForms);
}

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

Backend& backend_for(const DeviceChoice& choice) {
  if (choice.kind == DeviceKind::cpu) return cpu_backend();
#ifdef HETRAIN_HAVE_CUDA_BACKEND
  return cuda::cuda_backend(choice.index);
#else
  fail("cuda:", choice.index, ": this build of hetrain has no CUDA backend; expected a choice "
       "made by choose_device");
#endif
}

SelectedDevice select_device(std::string_view text, int local_rank) {
  DeviceRequest req = parse_device(text);
  GpuAvailability gpus = req.kind == DeviceRequest::Kind::cpu ? GpuAvailability{} : query_gpus();
  DeviceChoice choice = choose_device(req, local_rank, gpus);
  return {&backend_for(choice), choice.note};
}

}  // namespace ht
