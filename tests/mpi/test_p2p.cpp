// Point to point over MPI: ordering, tensors, deadlines, the doorbell, clock offsets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "comm/clock_sync.h"
#include "comm/doorbell.h"
#include "core/error.h"
#include "mpi_util.h"
#include "ops/ops.h"

using namespace ht;
using namespace ht::comm;
using namespace mpi_test;

TEST_CASE("p2p: 100 messages of one pair and tag arrive in send order") {
  Communicator& w = world();
  REQUIRE(w.size() >= 2);
  const int peer = w.rank() ^ 1;  // pairs (0, 1), (2, 3)
  if (peer < w.size()) {
    constexpr int n = 100;
    if (w.rank() % 2 == 0) {
      std::vector<int> values(n);
      std::vector<Request> sends;
      for (int i = 0; i < n; ++i) {
        values[static_cast<size_t>(i)] = i * 7 + w.rank();
        sends.push_back(w.isend_bytes(&values[static_cast<size_t>(i)], sizeof(int), peer, 21));
      }
      for (auto& s : sends) CHECK(s.wait(kLong) == WaitStatus::done);
    } else {
      std::vector<int> got(n, -1);
      std::vector<Request> recvs;
      for (int i = 0; i < n; ++i)
        recvs.push_back(w.irecv_bytes(&got[static_cast<size_t>(i)], sizeof(int), peer, 21));
      // Waited in reverse: matching follows the posting order, not the waiting order.
      for (int i = n - 1; i >= 0; --i)
        CHECK(recvs[static_cast<size_t>(i)].wait(kLong) == WaitStatus::done);
      int wrong = 0;
      for (int i = 0; i < n; ++i) wrong += got[static_cast<size_t>(i)] != i * 7 + peer;
      CHECK(wrong == 0);
    }
  }
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("p2p: tensors travel; a shape mismatch names both shapes and consumes the message") {
  Communicator& w = world();
  const int peer = w.rank() ^ 1;
  if (peer < w.size()) {
    if (w.rank() % 2 == 0) {
      Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, cpu_backend());
      w.send(t, peer, 30, kLong, "the test tensor");
      w.send(transpose(t, 0, 1), peer, 30, kLong, "the test tensor");  // a strided view goes out dense
      w.send(Tensor::full({1000, 100}, static_cast<float>(w.rank()), cpu_backend()), peer, 30, kLong, "the test tensor");
    } else {
      Tensor wrong = Tensor::zeros({3, 2}, cpu_backend());
      const std::string both =
          "recv: tensor from rank " + std::to_string(peer) +
          " tag 30 is [2, 3] float32 (24 bytes); `into` is [3, 2] float32 (24 bytes)";
      CHECK_THROWS_WITH_AS(w.recv(wrong, peer, 30, kLong), doctest::Contains(both.c_str()), Error);
      Tensor right = Tensor::zeros({3, 2}, cpu_backend());
      REQUIRE(w.recv(right, peer, 30, kLong) == WaitStatus::done);
      CHECK(right.to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
      // Received into a strided view of a larger tensor.
      Tensor base = Tensor::zeros({100, 1000}, cpu_backend());
      Tensor view = transpose(base, 0, 1);
      REQUIRE(w.recv(view, peer, 30, kLong) == WaitStatus::done);
      CHECK(base.to_vector() == std::vector<float>(100000, static_cast<float>(peer)));
    }
  }
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("p2p: a receive with no sender times out, and the rank stays usable") {
  Communicator& w = world();
  const int from = (w.rank() + 1) % w.size();
  const int to = (w.rank() + w.size() - 1) % w.size();
  float x = -1.f;
  const auto t0 = Clock::now();
  CHECK(w.recv_bytes(&x, sizeof x, from, 77, 0.2s) == WaitStatus::timed_out);
  const double took = seconds_since(t0);
  CHECK(took >= 0.2);  // how late it returns depends on the load, not the code
  Request r = w.irecv_bytes(&x, sizeof x, from, 77);
  CHECK(r.wait(0.01s) == WaitStatus::timed_out);
  CHECK_FALSE(r.test());  // cancelled: never completes
  CHECK(w.barrier(kLong) == WaitStatus::done);

  // The same pair and tag now carry a message: the withdrawn receives do not take it.
  float mine = static_cast<float>(w.rank()) + 0.5f, got = 0.f;
  Request send = w.isend_bytes(&mine, sizeof mine, to, 77);
  CHECK(w.recv_bytes(&got, sizeof got, from, 77, kLong) == WaitStatus::done);
  CHECK(send.wait(kLong) == WaitStatus::done);
  CHECK(got == static_cast<float>(from) + 0.5f);
  CHECK(x == -1.f);
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("p2p: bad ranks and wrong sizes raise errors naming the values") {
  Communicator& w = world();
  int v = 0;
  const std::string range = "isend_bytes: destination rank " + std::to_string(w.size()) +
                            " is out of range [0, " + std::to_string(w.size()) + ")";
  CHECK_THROWS_WITH_AS(w.send_bytes(&v, sizeof v, w.size(), 0, kLong, "the test message"), doctest::Contains(range.c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(w.irecv_bytes(&v, sizeof v, 0, -1),
                       doctest::Contains("irecv_bytes: tag -1 is out of range"), Error);
  // A message longer than the receive buffer is an error, not an overwrite.
  const int peer = w.rank() ^ 1;
  if (peer < w.size()) {
    if (w.rank() % 2 == 0) {
      std::vector<char> big(10000, 'x');
      w.send_bytes(big.data(), big.size(), peer, 31, kLong, "the test message");
    } else {
      char small[16] = {};
      CHECK_THROWS_WITH_AS(w.recv_bytes(small, sizeof small, peer, 31, kLong),
                           doctest::Contains("has 10000 bytes; expected 16"), Error);
    }
  }
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("doorbell: a ring from another process ends a long sleep at once") {
  Communicator& w = world();
  const Doorbell* bell = process_doorbell();
  REQUIRE(bell != nullptr);  // every rank of this suite is on one host
  if (w.rank() == 1) {
    REQUIRE(w.barrier(kLong) == WaitStatus::done);  // rank 0 rings 50 ms after this
    const uint32_t heard = bell->heard();
    const auto t0 = Clock::now();
    const bool rung = bell->sleep(heard, std::chrono::seconds(5));
    const double slept = seconds_since(t0);
    CHECK(rung);
    CHECK(slept > 0.02);  // it waited for that ring
    CHECK(slept < 1.0);   // without it: 5 s
    // Rung before the sleep (the counter moved since `heard`): it returns at once.
    CHECK(bell->sleep(heard, std::chrono::seconds(5)));
  } else {
    REQUIRE(w.barrier(kLong) == WaitStatus::done);
    if (w.rank() == 0) {
      std::this_thread::sleep_for(50ms);
      bell->ring(1);
    }
  }
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("doorbell: a message ends the receiver's polled wait at once, not at the end of its sleep") {
  // The receiver's sleeps are set to 2 s (set_backoff_pauses), so a message sent 20 ms
  // into its wait lands during one: the sender's ring wakes it at once, and without the
  // ring it would be taken at that sleep's end, about 2 s later. The threshold between
  // the two, 1 s, is far from both, so a loaded machine's scheduling delays (milliseconds)
  // do not decide the verdict. Both clocks are the host's monotonic one.
  Communicator& w = world();
  if (w.rank() < 2) {
    std::vector<double> latency;
    for (int i = 0; i < 7; ++i) {
      int64_t sent = 0;
      if (w.rank() == 0) {
        std::this_thread::sleep_for(20ms);
        sent = Clock::now().time_since_epoch().count();
        w.send_bytes(&sent, sizeof sent, 1, 90, kLong, "the test message");
      } else {
        const BackoffPauses before = backoff_pauses();
        set_backoff_pauses({std::chrono::seconds(2), std::chrono::seconds(2)});
        const WaitStatus got_it = w.recv_bytes(&sent, sizeof sent, 0, 90, kLong);
        const auto got = Clock::now().time_since_epoch().count();
        set_backoff_pauses(before);  // the barriers below sleep as usual
        REQUIRE(got_it == WaitStatus::done);
        latency.push_back(std::chrono::duration<double>(Clock::duration(got - sent)).count());
      }
    }
    if (w.rank() == 1) {
      std::sort(latency.begin(), latency.end());
      const double median = latency[latency.size() / 2];
      MESSAGE("median delivery of a message 20 ms into a wait whose sleeps are 2 s: ", median * 1e6, " us");
      CHECK(median < 1.0);
    }
  }
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("doorbell: the backoff pauses are checked") {
  const BackoffPauses before = backoff_pauses();
  CHECK(before.min == std::chrono::microseconds(20));
  CHECK(before.max == std::chrono::microseconds(1000));
  CHECK_THROWS_WITH_AS(set_backoff_pauses({std::chrono::microseconds(0), std::chrono::microseconds(10)}),
                       doctest::Contains("expected 1 us <= min <= max"), Error);
  CHECK_THROWS_WITH_AS(set_backoff_pauses({std::chrono::microseconds(50), std::chrono::microseconds(10)}),
                       doctest::Contains("backoff pauses 50 to 10 us"), Error);
  CHECK(backoff_pauses().min == before.min);
}

TEST_CASE("clock sync: ranks of one host read one clock, and come out within their error of 0") {
  // Each rank's reading lies between rank 0's two, so its offset from their midpoint is
  // within half the round trip; ranks that share rank 0's clock must show that, the
  // round trip being short (a spinning wait on one host) and not 0.
  Communicator& w = world();
  const std::vector<ClockOffset> clocks = clock_offsets(w, 8, kLong);
  if (w.rank() == 0) {
    REQUIRE(static_cast<int>(clocks.size()) == w.size());
    CHECK(clocks[0].offset_s == 0);
    CHECK(clocks[0].error_s == 0);
    for (int r = 1; r < w.size(); ++r) {
      CAPTURE(r);
      const ClockOffset& c = clocks[static_cast<size_t>(r)];
      MESSAGE("rank ", r, ": offset ", c.offset_s * 1e6, " us within +-", c.error_s * 1e6, " us");
      CHECK(std::abs(c.offset_s) <= c.error_s);
      CHECK(c.error_s > 0);
      CHECK(c.error_s < 0.005);
    }
  } else {
    CHECK(clocks.empty());
  }
  CHECK_THROWS_WITH_AS(clock_offsets(w, 0, kLong), doctest::Contains("0 rounds; expected at least 1"), Error);
  CHECK(w.barrier(kLong) == WaitStatus::done);
}
