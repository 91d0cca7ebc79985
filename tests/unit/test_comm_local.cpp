// The communicator without mpirun: a world of one rank whose sends to self go through
// an in-process queue.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>

#include "comm/communicator.h"
#include "comm/local_communicator.h"
#include "core/error.h"
#include "core/wall_time.h"
#include "ops/ops.h"
#include "tests/harness/deadline_one_member.h"

using namespace ht;
using namespace ht::comm;
using namespace std::chrono_literals;

TEST_CASE("comm local: world() without mpirun is one rank") {
  REQUIRE(std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr);
  Communicator& w = world();
  CHECK(w.size() == 1);
  CHECK(w.rank() == 0);
  CHECK(w.local_rank() == 0);
  CHECK(w.local_size() == 1);
  CHECK_FALSE(w.host().empty());
  CHECK(&w == &world());
  CHECK(w.barrier(0.1s) == WaitStatus::done);
  CHECK(w.allgather("abc", 1s, "the test items") == std::vector<std::string>{"abc"});
}

TEST_CASE("comm local: tensors sent to self come back") {
  Communicator& w = world();
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, cpu_backend());
  w.send(t, 0, 5, 1s, "the test tensor");
  Tensor into = Tensor::zeros({2, 3}, cpu_backend());
  REQUIRE(w.recv(into, 0, 5, 1s) == WaitStatus::done);
  CHECK(into.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});

  // A strided view goes out dense; int32 keeps its dtype.
  w.send(transpose(t, 0, 1), 0, 5, 1s, "the test tensor");
  w.send(Tensor::from_ints({7, 8}, {2}, cpu_backend()), 0, 6, 1s, "the test tensor");
  Tensor tt = Tensor::zeros({3, 2}, cpu_backend());
  Tensor ids = Tensor::from_ints({0, 0}, {2}, cpu_backend());
  REQUIRE(w.recv(ids, 0, 6, 1s) == WaitStatus::done);
  REQUIRE(w.recv(tt, 0, 5, 1s) == WaitStatus::done);
  CHECK(tt.to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(ids.to_ints() == std::vector<int32_t>{7, 8});

  // Receives posted first take messages in posting order.
  int a = 0, b = 0;
  Request ra = w.irecv_bytes(&a, sizeof a, 0, 9);
  Request rb = w.irecv_bytes(&b, sizeof b, 0, 9);
  CHECK_FALSE(rb.test());
  int one = 1, two = 2;
  w.send_bytes(&one, sizeof one, 0, 9, 1s, "the test message");
  w.send_bytes(&two, sizeof two, 0, 9, 1s, "the test message");
  CHECK(rb.wait(1s) == WaitStatus::done);
  CHECK(ra.wait(1s) == WaitStatus::done);
  CHECK(a == 1);
  CHECK(b == 2);
}

TEST_CASE("comm local: a receive with nothing to receive times out, then is withdrawn") {
  Communicator& w = world();
  float x = 0;
  const auto t0 = Clock::now();
  CHECK(w.recv_bytes(&x, sizeof x, 0, 40, 0.05s) == WaitStatus::timed_out);
  const double took = seconds_since(t0);
  // Only the lower bound is the code's: how late the wait returns depends on the load.
  CHECK(took >= 0.05);
  // The withdrawn receive must not take this message: the next receive does.
  float y = 3.5f, z = 0;
  w.send_bytes(&y, sizeof y, 0, 40, 1s, "the test message");
  CHECK(w.recv_bytes(&z, sizeof z, 0, 40, 1s) == WaitStatus::done);
  CHECK(x == 0);
  CHECK(z == 3.5f);
  // Destroying an unfinished receive withdraws it rather than waiting forever.
  { Request dropped = w.irecv_bytes(&x, sizeof x, 0, 41); }
  w.send_bytes(&y, sizeof y, 0, 41, 1s, "the test message");
  CHECK(w.recv_bytes(&z, sizeof z, 0, 41, 1s) == WaitStatus::done);
  CHECK(x == 0);
}

TEST_CASE("comm local: bad arguments name the op and the value") {
  Communicator& w = world();
  int v = 0;
  CHECK_THROWS_WITH_AS(w.send_bytes(&v, sizeof v, 1, 0, 1s, "the test message"),
                       doctest::Contains("isend_bytes: destination rank 1 is out of range [0, 1)"),
                       Error);
  CHECK_THROWS_WITH_AS(w.recv_bytes(&v, sizeof v, -1, 0, 1s),
                       doctest::Contains("irecv_bytes: source rank -1 is out of range [0, 1)"),
                       Error);
  CHECK_THROWS_WITH_AS(w.send_bytes(&v, sizeof v, 0, -3, 1s, "the test message"),
                       doctest::Contains("tag -3 is out of range"), Error);
  CHECK_THROWS_WITH_AS(w.send_bytes(&v, static_cast<size_t>(-4), 0, 0, 1s, "the test message"),
                       doctest::Contains("(-4 as signed) is invalid"), Error);
  CHECK_THROWS_WITH_AS(w.recv_bytes(&v, sizeof v, 0, 0, -1s),
                       doctest::Contains("timeout -1 s is invalid"), Error);
  CHECK_THROWS_WITH_AS(w.send(Tensor::zeros({2}, cpu_backend()), 3, 0, 1s, "the test tensor"),
                       doctest::Contains("isend: destination rank 3"), Error);

  // A tensor of another shape: both shapes in the message, and the queue stays usable.
  w.send(Tensor::zeros({2, 3}, cpu_backend()), 0, 11, 1s, "the test tensor");
  Tensor wrong = Tensor::zeros({3, 2}, cpu_backend());
  CHECK_THROWS_WITH_AS(
      w.recv(wrong, 0, 11, 1s),
      doctest::Contains("tensor from rank 0 tag 11 is [2, 3] float32 (24 bytes); `into` is "
                        "[3, 2] float32 (24 bytes)"),
      Error);
  // Bytes of the wrong size are dropped with an error; the next message is intact.
  int64_t big = 7;
  w.send_bytes(&big, sizeof big, 0, 12, 1s, "the test message");
  w.send_bytes(&v, sizeof v, 0, 12, 1s, "the test message");
  CHECK_THROWS_WITH_AS(w.recv_bytes(&v, sizeof v, 0, 12, 1s),
                       doctest::Contains("has 8 bytes; expected 4"), Error);
  CHECK(w.recv_bytes(&v, sizeof v, 0, 12, 1s) == WaitStatus::done);

  std::vector<Tensor> ints{Tensor::from_ints({1}, {1}, cpu_backend())};
  CHECK_THROWS_WITH_AS(w.allreduce_sum(ints, 1s),
                       doctest::Contains("allreduce_sum: bucket 0 of shape [1] is int32"), Error);
  CHECK_THROWS_WITH_AS(w.set_link_emulation({{}, {}}),
                       doctest::Contains("got 2 links for a communicator of 1"), Error);
  CHECK_THROWS_WITH_AS(w.set_link_emulation({{-1.0, 0.0}}),
                       doctest::Contains("rank 0 latency -1 s is invalid"), Error);
}

TEST_CASE("comm local: collectives over one rank and split") {
  Communicator& w = world();
  std::vector<Tensor> buckets{Tensor::full({3}, 2.f, cpu_backend()), Tensor::full({1}, -1.f, cpu_backend())};
  CHECK(w.allreduce_sum(buckets, 1s) == WaitStatus::done);
  CHECK(buckets[0].to_vector() == std::vector<float>{2, 2, 2});
  auto sub = w.split(0, 0, 1s, "the test groups");
  REQUIRE(sub.get() != nullptr);
  CHECK(sub->size() == 1);
  CHECK(w.split(-1, 0, 1s, "the test groups").get() == nullptr);
  CHECK(w.broadcast("plan", 0, 1s, "the test broadcast") == "plan");
  CHECK(w.consult("item")->finish([](const std::vector<std::string>& items) { return items[0] + "!"; }, 1s,
                                  "the test consultation") == "item!");
}

TEST_CASE("comm local: every wait refuses a negative timeout by name, before it waits") {
  Communicator& w = world();
  CHECK_THROWS_WITH_AS(w.split(0, 0, -1s, "x"), doctest::Contains("split: timeout -1 s is invalid"), Error);
  CHECK_THROWS_WITH_AS(w.allgather("", -1s, "x"), doctest::Contains("allgather: timeout -1 s is invalid"), Error);
  CHECK_THROWS_WITH_AS(w.broadcast("", 0, -1s, "x"), doctest::Contains("broadcast: timeout -1 s is invalid"), Error);
  int v = 0;
  CHECK_THROWS_WITH_AS(w.send_bytes(&v, sizeof v, 0, 3, -1s, "x"), doctest::Contains("send_bytes: timeout -1 s"), Error);
  CHECK_THROWS_WITH_AS(w.send(Tensor::zeros({1}, cpu_backend()), 0, 3, -1s, "x"), doctest::Contains("send: timeout -1 s"), Error);
  CHECK(w.recv_bytes(&v, sizeof v, 0, 3, 0.01s) == WaitStatus::timed_out);  // nothing was sent
}

TEST_CASE("comm local: emulated link delays a send to self (emulation)") {
  LocalCommunicator c({{0.01, 1e6}});  // 10 ms each way, 1 MB/s
  std::vector<char> out(20000, 'x'), in(20000);
  const auto t0 = Clock::now();
  c.send_bytes(out.data(), out.size(), 0, 1, 1s, "the test message");
  REQUIRE(c.recv_bytes(in.data(), in.size(), 0, 1, 2s) == WaitStatus::done);
  const double took = seconds_since(t0);  // 2 * 10 ms + 20 ms
  CHECK(took >= 0.04);  // the lower bound is the emulation's; lateness is the load's
  CHECK(in == out);
  // Not arrived yet at a short deadline: timed out, and the message is still there.
  c.send_bytes(out.data(), out.size(), 0, 1, 1s, "the test message");
  CHECK(c.recv_bytes(in.data(), in.size(), 0, 1, 0.005s) == WaitStatus::timed_out);
  CHECK(c.recv_bytes(in.data(), in.size(), 0, 1, 2s) == WaitStatus::done);
}

TEST_CASE("comm local: a deadline reduction of one member gives back its own gradients and record") {
  harness::check_one_member_deadline(cpu_backend());  // tests/cuda runs it on a GPU
}
