#include "backend/cuda/device_select.h"

#include "backend/cuda/cuda_module.h"
#include "backend/registry.h"
#include "core/error.h"

namespace ht {

namespace {

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
  const bool usable = gpus.backend_built && gpus.module_error.empty() && gpus.count > 0;
  const std::string reason =
      !gpus.backend_built ? std::string("this build of hetrain has no CUDA backend (configured "
                                        "without nvcc, cuBLAS and cuDNN, or with -Dcuda=disabled)")
      : !gpus.module_error.empty() ? gpus.module_error
                                   : "no usable GPU on this machine (" + gpus.why_none + ")";
  if (req.kind == DeviceRequest::Kind::automatic && !usable) {
    c.note = "device \"auto\": " + reason + "; training on the CPU";
    return c;
  }
  if (!gpus.module_error.empty()) fail("device ", quoted(req.text), ": ", reason);
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
  std::string why;
  const cuda::ModuleApi* api = cuda_module(why);
  if (api == nullptr) {
    g.module_error = why;
    g.why_none = why;
    return g;
  }
  g.count = api->device_count(g.why_none);
#endif
  return g;
}

Backend& backend_for(const DeviceChoice& choice) {
  if (choice.kind == DeviceKind::cpu) return cpu_backend();
  std::string why;
  const cuda::ModuleApi* api = cuda_module(why);
  if (api == nullptr) fail("cuda:", choice.index, ": ", why, "; expected a choice made by choose_device");
  Backend& be = api->backend(choice.index);
  register_backend(DeviceKind::cuda, choice.index, be);
  set_peer_copy(api->peer_copy);
  return be;
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
