// Every wait on a peer is bounded: for each kind of wait, one rank stops itself with
// SIGSTOP instead of taking part, the others wait with a short timeout, and each checks
// what its wait reports (for the waits that raise, that the message names this rank,
// the stopped rank and what was awaited). The stopped rank stays stopped until the first
// of the others has caught its timeout (it cannot fire early: nothing arrives from a
// stopped process), which then continues it; the stopped rank then skips its part, so
// the verdict does not depend on how long anyone took. Each case runs on a fresh
// sub-communicator: a collective that timed out leaves its communicator unusable.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "comm/deadline_reduce.h"
#include "mpi_util.h"

using namespace ht;
using namespace ht::comm;
using namespace mpi_test;

namespace {

constexpr Timeout kShort{0.3};

// Runs one case: `victim` (a world rank) stops itself; every other rank runs
// `others(group)` on a fresh group of all ranks; the first of them continues the victim
// afterwards. `victim_after` runs on the victim once it is continued.
template <class Others, class After>
void with_rank_stopped(int victim, Others&& others, After&& victim_after) {
  Communicator& w = world();
  REQUIRE(w.size() >= 3);
  const std::vector<pid_t>& pids = world_pids();
  std::unique_ptr<Communicator> group = w.split(0, w.rank(), kLong, "a fresh group for the case");
  if (w.rank() == victim) {
    std::raise(SIGSTOP);
    victim_after(*group);
  } else {
    others(*group);
    if (w.rank() == (victim == 0 ? 1 : 0)) continue_once_stopped(pids[static_cast<size_t>(victim)]);
  }
  REQUIRE(w.barrier(kLong) == WaitStatus::done);
}

template <class Others>
void with_rank_stopped(int victim, Others&& others) {
  with_rank_stopped(victim, std::forward<Others>(others), [](Communicator&) {});
}

// Runs `wait`, which must raise PeerTimeout no sooner than kShort; returns its message.
template <class Wait>
std::string peer_timeout_of(Wait&& wait) {
  const auto t0 = Clock::now();
  try {
    wait();
  } catch (const PeerTimeout& e) {
    CHECK(seconds_since(t0) >= kShort.count());
    return e.what();
  }
  FAIL("expected a PeerTimeout");
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("waits: the message names this rank, the ranks not heard from, what was awaited and how long") {
  CHECK(peer_timeout_message(2, {1}, "the plan broadcast", Timeout(0.5)) ==
        "rank 2: no word from rank 1 after 0.5 s waiting for the plan broadcast; it has stalled or died");
  CHECK(peer_timeout_message(0, {1, 3}, "the config check", Timeout(2)) ==
        "rank 0: no word from ranks 1, 3 after 2 s waiting for the config check; they have stalled or died");
  CHECK(peer_timeout_message(3, {}, "stage 1's gradient sums", Timeout(300)) ==
        "rank 3: timed out after 300 s waiting for stage 1's gradient sums; a rank of the group has stalled or died");
}

TEST_CASE("waits: a receive from a stopped rank times out") {
  with_rank_stopped(1, [](Communicator& g) {
    if (g.rank() != 0) return;
    int x = 0;
    const auto t0 = Clock::now();
    CHECK(g.recv_bytes(&x, sizeof x, 1, 5, kShort) == WaitStatus::timed_out);
    CHECK(seconds_since(t0) >= kShort.count());
  });
}

TEST_CASE("waits: a rank stopped inside its own wait past the timeout waits on once continued") {
  // Rank 1 waits (2 s) for rank 2's message; rank 0 stops rank 1 inside that wait for
  // longer than its timeout, continues it, and only then lets rank 2 send. The time rank
  // 1 was stopped is not rank 2's delay: its wait must take the message, where it had
  // woken with its deadline passed and named rank 2.
  constexpr Timeout kWait{2.0};
  Communicator& w = world();
  REQUIRE(w.size() >= 3);
  const std::vector<pid_t>& pids = world_pids();
  std::unique_ptr<Communicator> g = w.split(w.rank() < 3 ? 0 : -1, w.rank(), kLong, "the case's three ranks");
  if (g) {
    int word = 0;
    if (g->rank() == 1) {
      g->send_bytes(&word, sizeof word, 0, 11, kLong, "word that the wait begins");
      int x = 0;
      CHECK(g->recv_bytes(&x, sizeof x, 2, 12, kWait) == WaitStatus::done);
      CHECK(x == 42);
    } else if (g->rank() == 0) {
      REQUIRE(g->recv_bytes(&word, sizeof word, 1, 11, kLong) == WaitStatus::done);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      REQUIRE(kill(pids[1], SIGSTOP) == 0);
      while (!is_stopped(pids[1])) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::duration<double>(kWait.count() + 0.5));
      REQUIRE(kill(pids[1], SIGCONT) == 0);
      g->send_bytes(&word, sizeof word, 2, 13, kLong, "word that rank 1 runs again");
    } else {
      REQUIRE(g->recv_bytes(&word, sizeof word, 0, 13, kLong) == WaitStatus::done);
      const int x = 42;
      g->send_bytes(&x, sizeof x, 1, 12, kLong, "the awaited message");
    }
  }
  REQUIRE(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("waits: a receive whose sender stopped mid-message is abandoned, and the wait times out") {
  // Only over TCP (the mpi-tcp suite): there a large message's data follows its header as
  // the sender progresses, so a sender stopped after posting it leaves the receive
  // matched but unfinished, which once waited for good. Over shared memory the receiver
  // copies the stopped sender's memory itself and the receive completes.
  const char* btl = std::getenv("OMPI_MCA_btl");
  if (!btl || std::string(btl) != "self,tcp") return;
  static std::vector<char> big(64 << 20, 'y');
  static std::vector<char> in(big.size());  // the abandoned receive may still write here
  Communicator& w = world();
  const std::vector<pid_t>& pids = world_pids();  // gathered while every rank runs
  std::unique_ptr<Communicator> g = w.split(w.rank() < 2 ? 0 : -1, w.rank(), kLong, "the case's pair");
  if (!g) return;
  if (g->rank() == 1) {
    Request send = g->isend_bytes(big.data(), big.size(), 0, 8);
    for (int i = 0; i < 1000; ++i) (void)send.test();  // the header on its way
    std::raise(SIGSTOP);
    CHECK(send.wait(kLong) == WaitStatus::done);  // taken by the abandoned receive
  } else {
    const auto t0 = Clock::now();
    CHECK(g->recv_bytes(in.data(), in.size(), 1, 8, kShort) == WaitStatus::timed_out);
    MESSAGE("the receive gave up after ", seconds_since(t0), " s");
    continue_once_stopped(pids[1]);
  }
  REQUIRE(g->barrier(kLong) == WaitStatus::done);
}

TEST_CASE("waits: a send to a stopped rank raises PeerTimeout naming it, and stays pending until it is taken") {
  // Far above OpenMPI's eager limit: the send completes only once the receiver takes it.
  static std::vector<char> big(8 << 20, 'x');
  with_rank_stopped(
      1,
      [](Communicator& g) {
        if (g.rank() != 0) return;
        const std::string m = peer_timeout_of([&] { g.send_bytes(big.data(), big.size(), 1, 6, kShort, "the test's 8 MiB message"); });
        CHECK(contains(m, "rank 0: no word from rank 1 after 0.3 s waiting for the test's 8 MiB message"));
      },
      [](Communicator& g) {  // takes the abandoned send, so that nothing is left in flight
        std::vector<char> in(big.size());
        CHECK(g.recv_bytes(in.data(), in.size(), 0, 6, kLong) == WaitStatus::done);
        CHECK(in == big);
      });
}

TEST_CASE("waits: an allreduce and a barrier with a stopped rank time out") {
  with_rank_stopped(1, [](Communicator& g) {
    std::vector<Tensor> b{Tensor::full({16}, 1.f, cpu_backend())};
    const auto t0 = Clock::now();
    CHECK(g.allreduce_sum(b, kShort) == WaitStatus::timed_out);
    CHECK(seconds_since(t0) >= kShort.count());
    CHECK(b[0].to_vector() == std::vector<float>(16, 1.f));  // left as it was
  });
  with_rank_stopped(2, [](Communicator& g) {
    const auto t0 = Clock::now();
    CHECK(g.barrier(kShort) == WaitStatus::timed_out);
    CHECK(seconds_since(t0) >= kShort.count());
  });
}

TEST_CASE("waits: after an allreduce or a barrier timed out, a roll call names the stopped rank") {
  // The others are not asserted present: a loaded host may start one of them past the
  // grace. The stopped rank never answers, and this rank is never absent to itself.
  auto named = [](const std::vector<int>& absent, int r) {
    return std::find(absent.begin(), absent.end(), r) != absent.end();
  };
  with_rank_stopped(2, [&](Communicator& g) {
    std::vector<Tensor> b{Tensor::full({16}, 1.f, cpu_backend())};
    REQUIRE(g.allreduce_sum(b, kShort) == WaitStatus::timed_out);
    const std::vector<int> absent = g.roll_call(kShort);
    CHECK(named(absent, 2));
    CHECK_FALSE(named(absent, world().rank()));
    CHECK(std::is_sorted(absent.begin(), absent.end()));
  });
  with_rank_stopped(1, [&](Communicator& g) {
    REQUIRE(g.barrier(kShort) == WaitStatus::timed_out);
    const std::vector<int> absent = g.roll_call(kShort);
    CHECK(named(absent, 1));
    CHECK_FALSE(named(absent, world().rank()));
  });
}

TEST_CASE("waits: a timeout's message says how long the roll call before it took, and only that one") {
  with_rank_stopped(2, [](Communicator& g) {
    REQUIRE(g.barrier(kShort) == WaitStatus::timed_out);
    // The stopped rank never answers: the roll call waits its whole grace, min(timeout, 10 s).
    const std::vector<int> stalled = stalled_among(g, {2}, Timeout(0.8));
    const std::string m = peer_timeout_message(world().rank(), stalled, "the test's barrier", Timeout(0.8));
    CHECK(contains(m, "no word from rank 2 after 0.8 s waiting for the test's barrier; it has stalled or died "
                      "(a roll call naming who was absent took "));
    CHECK(contains(m, " s more)"));
    // The next message follows no roll call of its own.
    CHECK_FALSE(contains(peer_timeout_message(world().rank(), {2}, "another wait", kShort), "roll call"));
  });
}

TEST_CASE("waits: an allgather with a stopped rank raises PeerTimeout naming it on every other rank") {
  with_rank_stopped(1, [](Communicator& g) {
    const std::string m = peer_timeout_of([&] { (void)g.allgather("item", kShort, "the test's items"); });
    CHECK(contains(m, "rank " + std::to_string(world().rank()) + ": no word from rank 1 after 0.3 s waiting for the test's items"));
  });
}

TEST_CASE("waits: the deadline reduction's end with a stopped member names it on every other rank") {
  // Who leads when the wait gives up depends on timing (members that hear nothing move to
  // the next leader); a member waiting for a leader that answers the roll call names the
  // absent rank, not the leader (it named rank 0 while rank 0 named the stopped rank). The
  // timeout, and so the roll call's grace, is 2 s, so that every live rank, four on two
  // cores, answers in time.
  with_rank_stopped(1, [](Communicator& g) {
    DeadlineOptions o;
    o.predicted_step_s = 0.005;
    o.peer_timeout_s = 2.0;
    DeadlineReduce reduce(
        g, o, std::vector<int64_t>(static_cast<size_t>(g.size()), 1), 0, [] { return ReplicaState{}; },
        [](const ReplicaState&) {});
    const std::string m = peer_timeout_of([&] { (void)reduce.finish(); });
    CHECK(contains(m, "rank " + std::to_string(world().rank()) + ": no word from rank 1 after 2 s"));
    CHECK(contains(m, "waiting for the deadline reduction's agreeing on the final step"));
    // Where this rank's leader answered the roll call, the message says whose leader it was.
    if (contains(m, "was waiting for it too"))
      CHECK(contains(m, "(rank " + std::to_string(world().rank()) + "'s leader then, rank "));
  });
}

TEST_CASE("waits: consult with a stopped rank: every rank names it, rank 0 being found waiting too") {
  // The roll call's grace is the timeout (up to 10 s): 2 s, so that every rank that
  // waits, four on two cores, answers it in time.
  const Timeout timeout(2.0);
  with_rank_stopped(1, [&](Communicator& g) {
    auto c = g.consult("item");
    const std::string m = peer_timeout_of([&] {
      (void)c->finish([](const std::vector<std::string>&) { return std::string("answer"); }, timeout, "the test consultation");
    });
    if (g.rank() == 0)
      CHECK(contains(m, "rank 0: no word from rank 1 after 2 s waiting for every rank's item of the test consultation"));
    else
      CHECK(contains(m, "no word from rank 1 after 2 s waiting for rank 0's answer to the test consultation "
                        "(rank 0 was waiting too)"));
  });
}

TEST_CASE("waits: consult with rank 0 stopped: every other rank names rank 0") {
  with_rank_stopped(0, [](Communicator& g) {
    auto c = g.consult("item");
    const std::string m = peer_timeout_of([&] {
      (void)c->finish([](const std::vector<std::string>&) { return std::string("answer"); }, kShort, "the test consultation");
    });
    CHECK(contains(m, "rank " + std::to_string(world().rank()) +
                          ": no word from rank 0 after 0.3 s waiting for rank 0's answer to the test consultation"));
  });
}

TEST_CASE("waits: a split with a stopped rank raises PeerTimeout naming it") {
  with_rank_stopped(3, [](Communicator& g) {
    const std::string m = peer_timeout_of([&] { (void)g.split(g.rank() % 2, 0, kShort, "the test's groups"); });
    CHECK(contains(m, "no word from rank 3 after 0.3 s waiting for every rank to join the test's groups"));
  });
}

TEST_CASE("waits: the plan broadcast with rank 0 stopped raises PeerTimeout naming rank 0") {
  with_rank_stopped(0, [](Communicator& g) {
    const std::string m = peer_timeout_of([&] { (void)g.broadcast("", 0, kShort, "the plan broadcast"); });
    CHECK(contains(m, "rank " + std::to_string(world().rank()) + ": no word from rank 0 after 0.3 s waiting for the plan broadcast"));
  });
}

TEST_CASE("waits: a broadcast reaches every rank, and its root waits for a large text to be taken") {
  Communicator& w = world();
  const std::string text(100000, 'p');  // beyond the eager limit: a rendezvous per rank
  CHECK(w.broadcast(w.rank() == 0 ? text : std::string("ignored"), 0, kLong, "the test broadcast") == text);
  CHECK(w.broadcast(std::to_string(w.rank()), 2, kLong, "the test broadcast") == "2");
  CHECK_THROWS_WITH_AS(w.broadcast("", w.size(), kLong, "x"), doctest::Contains("root rank 4 is out of range"), Error);
}

TEST_CASE("waits: a timeout that is negative or not finite is refused by name") {
  Communicator& w = world();
  CHECK_THROWS_WITH_AS(w.barrier(Timeout(-1)), doctest::Contains("barrier: timeout -1 s is invalid"), Error);
  CHECK_THROWS_WITH_AS((void)w.allgather("", Timeout(std::numeric_limits<double>::infinity()), "x"),
                       doctest::Contains("allgather: timeout inf s is invalid; expected a finite number"), Error);
  REQUIRE(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("waits: in a sub-communicator the message names world ranks") {
  // World ranks 3, 2, 1 form a group in that order (group ranks 0, 1, 2); world rank 2
  // stops, and world ranks 1 and 3 must name it as rank 2, themselves by their world rank.
  Communicator& w = world();
  REQUIRE(w.size() == 4);
  const std::vector<pid_t>& pids = world_pids();
  std::unique_ptr<Communicator> group = w.split(w.rank() == 0 ? -1 : 0, -w.rank(), kLong, "the reversed group");
  if (w.rank() == 2) {
    std::raise(SIGSTOP);
  } else if (group) {
    CHECK(group->world_rank(group->rank()) == w.rank());
    const std::string m = peer_timeout_of([&] { (void)group->allgather("item", kShort, "the test's items"); });
    CHECK(contains(m, "rank " + std::to_string(w.rank()) + ": no word from rank 2 after 0.3 s waiting for the test's items"));
    if (w.rank() == 1) continue_once_stopped(pids[2]);
  }
  REQUIRE(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("waits: a send's label names its destination by world rank, tag and size") {
  // A group in reverse order, so that a group rank is not the world rank it names.
  static std::vector<char> big(8 << 20, 'z');
  Communicator& w = world();
  std::unique_ptr<Communicator> g = w.split(0, w.size() - w.rank(), kLong, "the case's reversed group");
  REQUIRE(g->world_rank(1) == w.size() - 2);
  if (g->rank() == 0) {
    Request send = g->isend_bytes(big.data(), big.size(), 1, 9);
    CHECK(send.label() == "a send to rank " + std::to_string(w.size() - 2) + " (tag 9, 8388608 bytes)");
    CHECK(send.wait(kLong) == WaitStatus::done);
  } else if (g->rank() == 1) {
    std::vector<char> in(big.size());
    CHECK(g->recv_bytes(in.data(), in.size(), 0, 9, kLong) == WaitStatus::done);
  }
  REQUIRE(g->barrier(kLong) == WaitStatus::done);
}
