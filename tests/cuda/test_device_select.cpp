// Device selection: the choice from the config's device text and the local rank, and its
// messages, on the machine's GPUs as they are described to it (so on any machine).
#include <doctest/doctest.h>

#include <string>

#include "backend/cuda/device_select.h"
#include "core/error.h"

using namespace ht;

namespace {

GpuAvailability no_driver() {
  return {true, 0, "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version", ""};
}
GpuAvailability gpus(int count) { return {true, count, "", ""}; }
GpuAvailability not_built() { return {false, 0, "", ""}; }

std::string error_of(const DeviceRequest& req, int local_rank, const GpuAvailability& g) {
  try {
    choose_device(req, local_rank, g);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string parse_error(const char* text) {
  try {
    parse_device(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("device: the accepted spellings") {
  CHECK(parse_device("cpu").kind == DeviceRequest::Kind::cpu);
  CHECK(parse_device("auto").kind == DeviceRequest::Kind::automatic);
  DeviceRequest any = parse_device("cuda");
  CHECK(any.kind == DeviceRequest::Kind::cuda);
  CHECK(any.index == -1);
  DeviceRequest third = parse_device("cuda:3");
  CHECK(third.kind == DeviceRequest::Kind::cuda);
  CHECK(third.index == 3);
}

TEST_CASE("device: a misspelt device names the text and the accepted forms") {
  for (const char* bad : {"gpu", "CUDA:0", "cuda:", "cuda:x", "cuda:-1", "cuda:1a", "cuda: 1", ""}) {
    CAPTURE(bad);
    std::string msg = parse_error(bad);
    CHECK(contains(msg, std::string("\"") + bad + "\""));
    CHECK(contains(msg, "expected \"cpu\", \"cuda\", \"cuda:N\""));
  }
}

TEST_CASE("device: cuda:0 on a machine without a GPU is a clear error") {
  std::string msg = error_of(parse_device("cuda:0"), 0, no_driver());
  CHECK(contains(msg, "device \"cuda:0\": no usable GPU on this machine"));
  CHECK(contains(msg, "driver version is insufficient"));  // the runtime's own reason
  CHECK(contains(msg, "or device \"cpu\" or \"auto\""));
  CHECK(contains(error_of(parse_device("cuda"), 0, gpus(0)), "no usable GPU"));
}

TEST_CASE("device: cuda in a build without the CUDA backend says so") {
  std::string msg = error_of(parse_device("cuda:0"), 0, not_built());
  CHECK(contains(msg, "this build of hetrain has no CUDA backend"));
  DeviceChoice c = choose_device(parse_device("auto"), 0, not_built());
  CHECK(c.kind == DeviceKind::cpu);
  CHECK(contains(c.note, "no CUDA backend"));
}

TEST_CASE("device: auto without a GPU trains on the CPU and says why") {
  DeviceChoice c = choose_device(parse_device("auto"), 2, no_driver());
  CHECK(c.kind == DeviceKind::cpu);
  CHECK(contains(c.note, "device \"auto\": no usable GPU"));
  CHECK(contains(c.note, "driver version is insufficient"));
  CHECK(contains(c.note, "training on the CPU"));
}

TEST_CASE("device: auto and cuda pick the GPU by local rank") {
  DeviceChoice c = choose_device(parse_device("auto"), 1, gpus(2));
  CHECK(c.kind == DeviceKind::cuda);
  CHECK(c.index == 1);
  CHECK(contains(c.note, "cuda:1 (local rank 1 of a node with 2 GPUs"));
  CHECK_FALSE(contains(c.note, "share"));
  DeviceChoice shared = choose_device(parse_device("cuda"), 3, gpus(2));
  CHECK(shared.index == 1);
  CHECK(contains(shared.note, "ranks share GPUs"));
}

TEST_CASE("device: an explicit index is kept, and checked against the GPUs there are") {
  DeviceChoice c = choose_device(parse_device("cuda:1"), 0, gpus(2));
  CHECK(c.kind == DeviceKind::cuda);
  CHECK(c.index == 1);
  CHECK(c.note.empty());
  std::string msg = error_of(parse_device("cuda:2"), 0, gpus(2));
  CHECK(contains(msg, "device \"cuda:2\": this machine has 2 GPUs (cuda:0 to cuda:1)"));
  CHECK(contains(msg, "expected an index below 2"));
  CHECK(contains(error_of(parse_device("cuda:1"), 0, gpus(1)), "has 1 GPU (cuda:0)"));
}

TEST_CASE("device: cpu needs no GPU, and a negative local rank is refused") {
  DeviceChoice c = choose_device(parse_device("cpu"), 0, no_driver());
  CHECK(c.kind == DeviceKind::cpu);
  CHECK(c.note.empty());
  CHECK(contains(error_of(parse_device("auto"), -1, gpus(1)), "the local rank -1 is negative"));
}

TEST_CASE("device: select_device on this machine") {
  // Both outcomes are checked: which one runs depends on the machine, not on the code.
  GpuAvailability here = query_gpus();
  CHECK(select_device("cpu", 0).backend == &cpu_backend());
  SelectedDevice chosen = select_device("auto", 0);
  if (here.backend_built && here.count > 0) {
    CHECK(chosen.backend->kind() == DeviceKind::cuda);
    CHECK(select_device("cuda:0", 0).backend->name() == "cuda:0");
  } else {
    CHECK(chosen.backend == &cpu_backend());
    CHECK(contains(chosen.note, "training on the CPU"));
    CHECK_THROWS_WITH_AS(select_device("cuda:0", 0), doctest::Contains("device \"cuda:0\": "), Error);
    if (here.backend_built) CHECK_FALSE(here.why_none.empty());
  }
}
