// The CUDA backend module's loading (backend/registry.h) and device selection where it
// fails: the errors name the file, dlerror()'s reason and what was expected. Runs on any
// machine; the real module is loaded where the build has one (its path from meson).
#include <doctest/doctest.h>

#include <string>

#include "backend/cuda/cuda_module.h"
#include "backend/cuda/device_select.h"
#include "backend/registry.h"
#include "core/error.h"

using namespace ht;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What query_gpus() reports where the module failed to load.
GpuAvailability module_failed(const std::string& why) { return {true, 0, why, why}; }

}  // namespace

TEST_CASE("cuda module: a missing file names the path and dlerror's reason") {
  std::string why;
  CHECK(open_cuda_module("/nonexistent/hetrain-cuda.so", why) == nullptr);
  CHECK(contains(why, "the CUDA backend module /nonexistent/hetrain-cuda.so could not be loaded: "));
  CHECK(contains(why, "No such file or directory"));  // dlerror's own words
  CHECK(contains(why, "beside the hetrain executable, or its path in HETRAIN_CUDA_MODULE"));
}

TEST_CASE("cuda module: a library without the entry point is refused, naming it") {
  std::string why;
  CHECK(open_cuda_module("libz.so.1", why) == nullptr);
  CHECK(contains(why, "libz.so.1 has no entry point hetrain_cuda_module ("));
  CHECK(contains(why, "expected hetrain's CUDA backend module, hetrain-cuda.so"));
}

TEST_CASE("cuda module: its path is $HETRAIN_CUDA_MODULE, else beside the executable") {
  const char* env = std::getenv("HETRAIN_CUDA_MODULE");
  const std::string path = cuda_module_path();
  if (env != nullptr && env[0] != '\0') {
    CHECK(path == env);
  } else {
    CHECK(path.size() > std::string("/hetrain-cuda.so").size());
    CHECK(path.substr(path.rfind('/')) == "/hetrain-cuda.so");
    CHECK(contains(path, "tests/cuda/"));  // this test's own directory
  }
}

TEST_CASE("cuda module: device cuda exits naming the module's error; auto falls back saying why") {
  const std::string why = "the CUDA backend module /x/hetrain-cuda.so could not be loaded: it is gone";
  CHECK_THROWS_WITH_AS(choose_device(parse_device("cuda:0"), 0, module_failed(why)),
                       doctest::Contains(("device \"cuda:0\": " + why).c_str()), Error);
  CHECK_THROWS_WITH_AS(choose_device(parse_device("cuda"), 0, module_failed(why)),
                       doctest::Contains(("device \"cuda\": " + why).c_str()), Error);
  DeviceChoice c = choose_device(parse_device("auto"), 0, module_failed(why));
  CHECK(c.kind == DeviceKind::cpu);
  CHECK(c.note == "device \"auto\": " + why + "; training on the CPU");
}

#ifdef HETRAIN_CUDA_MODULE_BUILT
TEST_CASE("cuda module: the built module loads, at this build's interface version") {
  std::string why;
  const cuda::ModuleApi* api = open_cuda_module(HETRAIN_CUDA_MODULE_BUILT, why);
  REQUIRE_MESSAGE(api != nullptr, why);
  CHECK(api->abi == cuda::kModuleAbi);
  std::string why_none;
  const int count = api->device_count(why_none);
  CHECK(count >= 0);
  if (count == 0) CHECK(contains(why_none, "cudaGetDeviceCount"));
}
#else
TEST_CASE("cuda module: a build without the CUDA backend says so") {
  std::string why;
  CHECK(cuda_module(why) == nullptr);
  CHECK(contains(why, "this build of hetrain has no CUDA backend"));
  std::string note;
  CHECK(loaded_cuda_module(note) == nullptr);
  CHECK(contains(note, "no GPU support in this build"));
  CHECK_FALSE(query_gpus().backend_built);
}
#endif
