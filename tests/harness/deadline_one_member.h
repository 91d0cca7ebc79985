// A deadline reduction of one member on backend `be`, for the unit (CPU) and cuda (GPU)
// suites: the leader alone closes each step with its own contribution, so the gradients
// go out through host memory and the sum that comes back into them is the gradients
// themselves, bit for bit, on their own backend (a GPU's in device memory).
#pragma once

#include <doctest/doctest.h>

#include <vector>

#include "comm/deadline_reduce.h"
#include "comm/local_communicator.h"
#include "tensor/tensor.h"

namespace ht::harness {

inline void check_one_member_deadline(Backend& be) {
  comm::LocalCommunicator one;
  comm::DeadlineOptions o;
  o.predicted_step_s = 0.01;
  o.peer_timeout_s = 10;
  comm::DeadlineReduce reduce(one, o, {7}, 0, [] { return comm::ReplicaState{}; }, [](const comm::ReplicaState&) {});
  std::vector<float> a(100), b(200);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 3;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -0.5f * static_cast<float>(i) + 1;
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<Tensor> grads{Tensor::from_vector(a, {100}, be), Tensor::from_vector(b, {20, 10}, be)};
    const comm::DeadlineOutcome out = reduce.reduce(grads, 7, 1.5, comm::Clock::now(), step == 1 ? 2 : 0);
    CHECK(out.record.step == step);
    CHECK(out.record.samples == 7);
    REQUIRE(out.record.contributors.size() == 1);
    CHECK(out.record.contributors[0].verdict == (step == 1 ? 2 : 0));
    CHECK(&grads[0].backend() == &be);
    CHECK(grads[0].to_vector() == a);
    CHECK(grads[1].to_vector() == b);
  }
  CHECK(reduce.finish().empty());
  CHECK(reduce.step() == 3);
}

}  // namespace ht::harness
