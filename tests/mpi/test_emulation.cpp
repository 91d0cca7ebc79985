// Link emulation (emulation, not real links): delays measured with ping-pongs between
// ranks 0 and 1 while the other ranks wait in barriers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "mpi_util.h"

using namespace ht;
using namespace ht::comm;
using namespace mpi_test;

namespace {

// Round trips of `bytes` out and 1 byte back between ranks 0 and 1; returns the fastest
// round trip on rank 0 (0 elsewhere). The fastest: a rank descheduled by other work on
// the cores only ever adds to a round, and the emulation never delivers before its
// model, so the fastest of several rounds is the one nearest the model whatever the
// load (with the median, 7 of 12 runs of the suite beside four busy loops failed).
// Checked against [model, 1.5 x model]: early would be a delay not applied, and a
// delay applied twice would be 2 x.
double round_trip_s(Communicator& w, size_t bytes, int rounds) {
  std::vector<char> buf(bytes, 'p');
  char ack = 'a';
  std::vector<double> took;
  if (w.rank() == 0) {
    for (int i = 0; i < rounds; ++i) {
      const auto t0 = Clock::now();
      w.send_bytes(buf.data(), bytes, 1, 50, kLong, "the test message");
      REQUIRE(w.recv_bytes(&ack, 1, 1, 51, kLong) == WaitStatus::done);
      took.push_back(seconds_since(t0));
    }
    return *std::min_element(took.begin(), took.end());
  }
  if (w.rank() == 1) {
    for (int i = 0; i < rounds; ++i) {
      REQUIRE(w.recv_bytes(buf.data(), bytes, 0, 50, kLong) == WaitStatus::done);
      w.send_bytes(&ack, 1, 0, 51, kLong, "the test message");
    }
  }
  return 0;
}

void emulate(Communicator& w, std::vector<LinkEmulation> links) {
  w.set_link_emulation(std::move(links));
  REQUIRE(w.barrier(kLong) == WaitStatus::done);
}

void report(Communicator& w, const char* what, double measured, double expected) {
  if (w.rank() == 0)
    std::printf("[emulation] %s: measured %.2f ms, model %.2f ms\n", what, measured * 1e3,
                expected * 1e3);
}

}  // namespace

TEST_CASE("emulation: one-way latency of 0<->1 messages follows the links") {
  Communicator& w = world();
  REQUIRE(w.size() >= 2);
  std::vector<LinkEmulation> links(static_cast<size_t>(w.size()));
  links[1].latency_s = 0.020;
  emulate(w, links);
  const double one = round_trip_s(w, 8, 7) / 2;
  report(w, "one-way 0<->1, rank 1 at 20 ms", one, 0.020);
  if (w.rank() == 0) CHECK((one >= 0.020 && one <= 1.5 * 0.020));

  links[0].latency_s = 0.020;
  emulate(w, links);
  const double both = round_trip_s(w, 8, 7) / 2;
  report(w, "one-way 0<->1, both at 20 ms", both, 0.040);
  if (w.rank() == 0) CHECK((both >= 0.040 && both <= 1.5 * 0.040));
  emulate(w, {});
}

TEST_CASE("emulation: 1 MB at 10 MB/s takes 100 ms, and sizes keep their order") {
  Communicator& w = world();
  std::vector<LinkEmulation> links(static_cast<size_t>(w.size()));
  links[0].bandwidth_bytes_per_s = 10e6;
  emulate(w, links);
  const double rtt = round_trip_s(w, 1000000, 3);
  report(w, "1 MB 0->1 at 10 MB/s (+1 byte back)", rtt, 0.100);
  if (w.rank() == 0) CHECK((rtt >= 0.100 && rtt <= 1.5 * 0.100));

  // A large message then a small one on one pair and tag: the small one must not
  // overtake (a receive of the wrong size would raise).
  if (w.rank() == 0) {
    std::vector<char> big(200000, 'b');
    int small = 42;
    Request a = w.isend_bytes(big.data(), big.size(), 1, 52);
    Request b = w.isend_bytes(&small, sizeof small, 1, 52);
    CHECK(a.wait(kLong) == WaitStatus::done);
    CHECK(b.wait(kLong) == WaitStatus::done);
  } else if (w.rank() == 1) {
    std::vector<char> big(200000);
    int small = 0;
    Request a = w.irecv_bytes(big.data(), big.size(), 0, 52);
    Request b = w.irecv_bytes(&small, sizeof small, 0, 52);
    CHECK(b.wait(kLong) == WaitStatus::done);
    CHECK(a.wait(kLong) == WaitStatus::done);
    CHECK(small == 42);
    CHECK(big[199999] == 'b');
  }
  emulate(w, {});
}

TEST_CASE("emulation: collectives complete no earlier than their model") {
  Communicator& w = world();
  const size_t p = static_cast<size_t>(w.size());
  std::vector<LinkEmulation> links(p, LinkEmulation{0.005, 0.0});
  emulate(w, links);
  const double hop = 0.010;  // 5 ms + 5 ms per ring hop
  const double barrier_model = std::ceil(std::log2(static_cast<double>(p))) * hop;
  auto t0 = Clock::now();
  REQUIRE(w.barrier(kLong) == WaitStatus::done);
  const double barrier_took = seconds_since(t0);
  report(w, "barrier, every rank at 5 ms", barrier_took, barrier_model);
  // Only the lower bound is the code's: how much later a collective completes depends on
  // the machine's load (the report above prints it).
  CHECK(barrier_took >= barrier_model);

  const double allreduce_model = 2.0 * static_cast<double>(p - 1) * hop;
  std::vector<Tensor> b{Tensor::full({16}, 1.f, cpu_backend())};
  t0 = Clock::now();
  REQUIRE(w.allreduce_sum(b, kLong) == WaitStatus::done);
  const double allreduce_took = seconds_since(t0);
  report(w, "allreduce of 64 bytes, every rank at 5 ms", allreduce_took, allreduce_model);
  CHECK(allreduce_took >= allreduce_model);
  CHECK(b[0].to_vector() == std::vector<float>(16, static_cast<float>(p)));

  emulate(w, {});
  CHECK(w.barrier(kLong) == WaitStatus::done);
}
