// parallel.sync deadline on a GPU rank: the reduction's messages live in host memory, so a
// contribution is copied out of device memory and the step's sum back into it.
#include <doctest/doctest.h>

#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "comm/deadline_reduce.h"
#include "comm/local_communicator.h"
#include "tensor/tensor.h"

using namespace ht;
using namespace ht::comm;

TEST_CASE("cuda deadline: a GPU rank's gradients go out through host memory and their sum comes back") {
  // One member: the leader closes each step with its own contribution, so the sum is the
  // gradients themselves, bit for bit (the CPU's twin is in tests/unit/test_comm_local.cpp).
  Backend& gpu = cuda::cuda_backend(0);
  LocalCommunicator comm;
  DeadlineOptions o;
  o.predicted_step_s = 0.01;
  o.peer_timeout_s = 10;
  DeadlineReduce reduce(comm, o, {7}, 0, [] { return ReplicaState{}; }, [](const ReplicaState&) {});
  std::vector<float> a(100), b(200);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 3;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -0.5f * static_cast<float>(i) + 1;
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<Tensor> grads{Tensor::from_vector(a, {100}, gpu), Tensor::from_vector(b, {20, 10}, gpu)};
    const DeadlineOutcome out = reduce.reduce(grads, 7, 1.5, Clock::now());
    CHECK(out.record.step == step);
    CHECK(out.record.samples == 7);
    CHECK(&grads[0].backend() == &gpu);
    CHECK(grads[0].to_vector() == a);
    CHECK(grads[1].to_vector() == b);
  }
  CHECK(reduce.finish().empty());
}
