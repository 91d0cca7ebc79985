// parallel.sync: deadline on three ranks (the fourth idle), one of which stalls: the
// others keep closing steps, every step's sum is exactly the sum of the contributions it
// names, and after the stalled rank returns every rank holds the same bytes.
//
// The stall is a wait for word from a peer, sent only once the others have closed ten
// steps without the stalled rank: were they held by it, the test would time out. So the
// verdict does not depend on timing or load, only on what must hold whatever the timing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/deadline_reduce.h"
#include "core/crc32.h"
#include "mpi_util.h"

using namespace ht;
using namespace ht::comm;
using namespace mpi_test;

namespace {

constexpr int kN = 257;         // parameters of the toy model
constexpr int64_t kSteps = 60;  // steps of the run
constexpr int64_t kStallAt = 5;
constexpr int64_t kStallSteps = 10;  // steps the others close before the stalled rank returns
constexpr int kReleaseTag = 777;
constexpr int kStalledAtTag = 778;
const std::vector<int64_t> kShares{5, 3, 2};
constexpr int64_t kGlobal = 10;

// The first n world ranks' own communicator (null on the others), for a test of n members.
std::unique_ptr<Communicator> first_ranks(int n) {
  REQUIRE(world().size() >= n);
  return world().split(world().rank() < n ? 0 : -1, world().rank(), kLong, "the test's group");
}

// Member j's contribution at `step` on weights `w`: the summed per-sample gradient of a
// quadratic loss, pre-scaled by 1 / global batch as the executor scales it.
std::vector<float> contribution(int j, int64_t step, const std::vector<float>& w) {
  std::vector<float> g(kN);
  const auto n = static_cast<float>(kShares[static_cast<size_t>(j)]);
  for (int i = 0; i < kN; ++i) {
    const float target = 0.1f * static_cast<float>(j + 1) + 0.001f * static_cast<float>(step) + 1e-4f * static_cast<float>(i);
    g[static_cast<size_t>(i)] = n * (w[static_cast<size_t>(i)] - target) / static_cast<float>(kGlobal);
  }
  return g;
}

void run_stall(int stalled, int64_t max_staleness) {
  std::unique_ptr<Communicator> group = first_ranks(3);
  if (!group) return;
  const int me = group->rank();
  const int releaser = stalled == 0 ? 1 : 0;
  std::vector<float> weights(kN, 0.5f);
  std::map<int64_t, std::vector<float>> before;  // this rank's weights before each step of its chain
  DeadlineOptions options;
  options.predicted_step_s = 0.005;
  options.slack = 0.5;
  options.max_staleness = max_staleness;
  options.peer_timeout_s = 20;
  DeadlineReduce reduce(
      *group, options, kShares, 0, [&] { return ReplicaState{weights, {}}; },
      [&](const ReplicaState& s) {
        REQUIRE(s.floats.size() == weights.size());
        weights = s.floats;
        before.clear();
      });
  std::vector<StepRecord> records;
  std::vector<StepRecord> applied_in_stall;  // the releaser's, applied by it before the release
  bool released = false;
  int checked_stale = 0;
  // The stalled rank stops at the first step it reaches from kStallAt on (a catch-up may
  // carry it past kStallAt itself) and tells the releaser the highest step it reached.
  int64_t stalled_at = -1;
  Request heard;
  if (me == releaser) heard = group->irecv_bytes(&stalled_at, sizeof stalled_at, stalled, kStalledAtTag);
  bool known = false;
  int64_t released_at = -1;  // the releaser's step when it released
  // The releaser's messages to the stalled rank and its term when it learned of the stall.
  int64_t sent_then = -1, term_then = -1;
  auto release = [&](int64_t s) {
    static const char kGo = 1;
    // While it is stopped a rank is sent at most kSendTo (4) results by a leader, and a
    // notice a term: never one a step (they piled up past thousands in a minute's stop).
    if (sent_then >= 0) {
      const int64_t sent = reduce.messages_sent_to(stalled) - sent_then, terms = reduce.term() - term_then;
      CHECK_MESSAGE(sent <= 4 + 2 * (terms + 1), "sent ", sent, " messages to the stopped rank over ", terms,
                    " term changes");
    }
    group->send_bytes(&kGo, 1, stalled, kReleaseTag, kLong, "the stalled rank's release");
    released = true;
    released_at = s;
  };
  int64_t highest = -1;  // the highest step this rank has reached
  while (reduce.step() < kSteps) {
    const int64_t s = reduce.step();
    highest = std::max(highest, s);
    known = known || (me == releaser && heard.test());
    if (known && sent_then < 0) sent_then = reduce.messages_sent_to(stalled), term_then = reduce.term();
    // After kStallSteps steps without it, or at the end when the stalled rank stopped late
    // (a load that left it out before may have carried it past kStallAt by catch-ups).
    if (me == releaser && known && !released && (s > stalled_at + kStallSteps || s == kSteps - 1)) release(s);
    if (me == stalled && s >= kStallAt && !released) {
      // Under leader churn a catch-up may have moved this rank back from steps it reached
      // (and contributed to) on a chain that was then left: those are not the stall's.
      stalled_at = highest;
      group->send_bytes(&stalled_at, sizeof stalled_at, releaser, kStalledAtTag, kLong, "the stalled step");
      char go = 0;
      REQUIRE(group->recv_bytes(&go, 1, releaser, kReleaseTag, kLong) == WaitStatus::done);
      released = true;
    }
    before[s] = weights;
    std::vector<Tensor> grads{Tensor::from_vector(contribution(me, s, weights), {kN}, cpu_backend())};
    const DeadlineOutcome o = reduce.reduce(grads, kShares[static_cast<size_t>(me)], 0.0, Clock::now());
    for (const StepRecord& r : o.missed) records.push_back(r);
    if (o.ended) break;
    const StepRecord& r = o.record;
    REQUIRE(r.step == reduce.step() - 1);
    // The reference: the named contributions, recomputed here on the state they were
    // computed on, summed in rank order as the leader sums them. Same operands, same
    // order, so the same bits.
    std::vector<float> ref(kN, 0.0f);
    bool complete = true;
    int64_t samples = 0;
    for (const Contribution& c : r.contributors) {
      CHECK(c.samples == kShares[static_cast<size_t>(c.rank)]);
      CHECK(c.staleness <= max_staleness);
      samples += c.samples;
      auto at = before.find(r.step - c.staleness);
      if (at == before.end()) {  // computed before this rank's catch-up: not known here
        complete = false;
        continue;
      }
      if (c.staleness > 0) ++checked_stale;
      const std::vector<float> g = contribution(c.rank, r.step - c.staleness, at->second);
      for (int i = 0; i < kN; ++i) ref[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
    }
    CHECK(samples == r.samples);
    if (complete && !o.caught_up) {
      const std::vector<float> got = grads[0].to_vector();
      CHECK(std::memcmp(got.data(), ref.data(), kN * sizeof(float)) == 0);
    }
    records.push_back(r);
    if (me == releaser && !released && !o.caught_up) applied_in_stall.push_back(r);
    // A step closed with nothing (a leader whose own gradient was of an older state, and
    // nobody else's in time) applies no update, on every rank alike, as the executor.
    if (r.samples == 0) continue;
    // The update of the sample-weighted mean over what arrived.
    const std::vector<float> sum = grads[0].to_vector();
    const float rescale = static_cast<float>(kGlobal) / static_cast<float>(r.samples);
    for (int i = 0; i < kN; ++i) weights[static_cast<size_t>(i)] -= 0.1f * sum[static_cast<size_t>(i)] * rescale;
  }
  if (me == releaser && !released) {  // caught up to the end before it could release
    REQUIRE(heard.wait(kLong) == WaitStatus::done);
    release(kSteps);
  }
  for (const StepRecord& r : reduce.finish()) records.push_back(r);
  CHECK(reduce.step() == kSteps);
  const std::vector<std::string> at = group->allgather(
      me == stalled ? std::to_string(stalled_at) : me == releaser ? std::to_string(released_at) : "", kLong,
      "the stalled step");
  stalled_at = std::stoll(at[static_cast<size_t>(stalled)]);
  released_at = std::stoll(at[static_cast<size_t>(releaser)]);
  MESSAGE("stalled at step ", stalled_at, ", released at step ", released_at);

  // What must hold whatever the timing: the releaser reached stalled_at + kStallSteps
  // while the stalled rank was blocked, so the others stepped without it. The steps the
  // releaser applied itself in that time, past the highest step the stalled rank had
  // reached, closed short without it and, when it is the leader, by another rank. (Records
  // a rank receives with a catch-up, or applied on a chain later left under leader churn,
  // are not checked here: they may be of another branch; the end state is, below.)
  if (me == releaser) {
    int seen = 0;
    for (const StepRecord& r : applied_in_stall) {
      if (r.step <= stalled_at) continue;
      ++seen;
      CHECK(r.closed_short);
      CHECK(r.samples_dropped >= kShares[static_cast<size_t>(stalled)]);
      for (const Contribution& c : r.contributors) CHECK((c.rank != stalled || c.staleness > 0));
      if (stalled == 0) CHECK(r.leader != 0);
    }
    CHECK(released_at > stalled_at);
    CHECK(seen >= 1);
    MESSAGE("steps the releaser applied during the stall: ", seen);
  }
  // Bit-identical replicas once the stalled rank has caught up.
  const std::string mine = crc32_hex(crc32_update(0, weights.data(), kN * sizeof(float)));
  const std::vector<std::string> all = group->allgather(mine, kLong, "the weights' checksums");
  for (size_t j = 0; j < all.size(); ++j) CHECK_MESSAGE(all[j] == all[0], "member ", j, "'s weights differ from member 0's");
  MESSAGE("stale contributions checked: ", checked_stale);
}

}  // namespace

TEST_CASE("deadline: a stalled member is left out, the others keep stepping, and all end identical") {
  run_stall(2, 0);
}

TEST_CASE("deadline: a stalled leader's steps are closed by its backup (late ones applied up to 2 steps stale)") {
  run_stall(0, 2);
}

TEST_CASE("deadline: each contribution's verdict reaches every rank in the step's record") {
  // Member 1 leaves out its own contribution (zeros, no samples, verdict 2) in every third
  // step, as the bad-node guard does. Every record that names a contributor must give
  // it the verdict it was sent with, on every rank; the budget is thousands of steps
  // long, so every member is in every step unless one is seconds late.
  std::unique_ptr<Communicator> group = first_ranks(3);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(kN, 0.5f);
  DeadlineOptions options;
  options.predicted_step_s = 5;
  options.slack = 1e4;
  options.peer_timeout_s = 60;
  DeadlineReduce reduce(
      *group, options, kShares, 0, [&] { return ReplicaState{weights, {}}; },
      [&](const ReplicaState& s) { weights = s.floats; });
  const auto flagged = [](int rank, int64_t step) { return rank == 1 && step % 3 == 1; };
  int seen = 0;
  for (int64_t s = 0; s < 30; ++s) {
    REQUIRE(reduce.step() == s);
    const bool out = flagged(me, s);
    std::vector<float> g = out ? std::vector<float>(kN, 0.0f) : contribution(me, s, weights);
    std::vector<Tensor> grads{Tensor::from_vector(g, {kN}, cpu_backend())};
    const DeadlineOutcome o =
        reduce.reduce(grads, out ? 0 : kShares[static_cast<size_t>(me)], 0.0, Clock::now(), out ? 2 : 0);
    REQUIRE(!o.caught_up);
    const StepRecord& r = o.record;
    REQUIRE(r.step == s);
    int fresh = 0;
    for (const Contribution& c : r.contributors) {
      CHECK(c.verdict == (flagged(c.rank, r.step) ? 2 : 0));
      fresh += c.staleness == 0 ? 1 : 0;
      if (c.verdict != 0) {
        CHECK(c.samples == 0);
        ++seen;
      }
    }
    // A contribution the sender left out arrived all the same: the step did not close short.
    if (fresh == 3) CHECK((!r.closed_short && r.samples_dropped == 0));
    if (r.samples == 0) continue;
    const std::vector<float> sum = grads[0].to_vector();
    const float rescale = static_cast<float>(kGlobal) / static_cast<float>(r.samples);
    for (int i = 0; i < kN; ++i) weights[static_cast<size_t>(i)] -= 0.1f * sum[static_cast<size_t>(i)] * rescale;
  }
  reduce.finish();
  CHECK(seen >= 1);
  const std::string mine = crc32_hex(crc32_update(0, weights.data(), kN * sizeof(float)));
  const std::vector<std::string> all = group->allgather(mine, kLong, "the weights' checksums");
  for (size_t j = 0; j < all.size(); ++j) CHECK_MESSAGE(all[j] == all[0], "member ", j, "'s weights differ from member 0's");
}

TEST_CASE("deadline: the chain hash covers the step, term, leader and contributors") {
  const std::vector<Contribution> a{{0, 5, 0}, {1, 3, 0}};
  const std::vector<Contribution> b{{0, 5, 0}, {2, 3, 0}};
  const std::vector<Contribution> bad{{0, 5, 0}, {1, 3, 0, 2}};  // rank 1's verdict differs
  const uint64_t h = mix_step_hash(1, 4, 0, 0, a);
  CHECK(h == mix_step_hash(1, 4, 0, 0, a));
  CHECK(h != mix_step_hash(1, 4, 0, 0, b));
  CHECK(h != mix_step_hash(1, 4, 0, 0, bad));
  CHECK(h != mix_step_hash(1, 5, 0, 0, a));
  CHECK(h != mix_step_hash(1, 4, 1, 1, a));
  CHECK(h != mix_step_hash(2, 4, 0, 0, a));
}

TEST_CASE("deadline: align_to takes the leader's state at exactly the step asked, or its own step once past it") {
  // Two members: member 1 stops contributing at step kAsk and asks for step kTarget
  // (a hybrid plan's rank behind its replica's other stages). The leader steps on alone.
  // Not ahead: it holds the request and answers when its own state is at kTarget. Ahead
  // (it was let reach kTarget + 2 first): it answers at once with its state then. Either
  // way member 1's state is the leader's at the step it landed on, the records of the
  // steps passed come with it, and the two end identical. The budgets are seconds long
  // where the order matters, so only a rank stopped for seconds could change it.
  constexpr int64_t kAsk = 3, kTarget = 8, kEnd = 16;
  constexpr int kAheadTag = 779;
  auto crc = [](const std::vector<float>& v) { return crc32_hex(crc32_update(0, v.data(), v.size() * sizeof(float))); };
  for (const bool ahead : {false, true}) {
    CAPTURE(ahead);
    // A communicator of its own per run: nothing one run's reduction left in flight can
    // reach the next one's.
    std::unique_ptr<Communicator> group = first_ranks(2);
    if (!group) continue;
    const int me = group->rank();
    std::vector<float> weights(kN, 0.5f);
    std::map<int64_t, std::string> at_start;  // the leader's state at each step's start
    DeadlineOptions options;
    options.predicted_step_s = ahead ? 0.005 : 2;
    options.slack = ahead ? 0.5 : 1;
    options.peer_timeout_s = 30;
    // One leader throughout (rank 0), whose behaviour this tests: at budgets of
    // milliseconds, a loaded host's delays handed the lead to member 1 in 2 of 40 runs
    // beside six busy loops.
    options.min_patience_s = 10;
    const std::vector<int64_t> shares{5, 3};
    DeadlineReduce reduce(
        *group, options, shares, 0, [&] { return ReplicaState{weights, {}}; },
        [&](const ReplicaState& s) { weights = s.floats; });
    int64_t landed = -1;
    std::string landed_crc;
    size_t passed = 0;
    while (reduce.step() < kEnd) {
      const int64_t s = reduce.step();
      if (me == 0) at_start[s] = crc(weights);
      if (me == 0 && ahead && s == kTarget + 2) {
        static const char kThere = 1;
        group->send_bytes(&kThere, 1, 1, kAheadTag, kLong, "word that the leader is past the target");
      }
      if (me == 1 && s == kAsk && landed < 0) {
        if (ahead) {
          char there = 0;
          REQUIRE(group->recv_bytes(&there, 1, 0, kAheadTag, kLong) == WaitStatus::done);
        }
        const DeadlineOutcome o = reduce.align_to(kTarget);
        CHECK(o.caught_up);
        // Ended only where the leader had finished training (ahead, it may reach kEnd
        // before the request arrives): its answer from finish is the end's.
        CHECK((!o.ended || reduce.step() == kEnd));
        landed = reduce.step();
        landed_crc = crc(weights);
        passed = o.missed.size();
        for (size_t i = 0; i < o.missed.size(); ++i) CHECK(o.missed[i].step == kAsk + static_cast<int64_t>(i));
        continue;
      }
      std::vector<Tensor> grads{Tensor::from_vector(contribution(me, s, weights), {kN}, cpu_backend())};
      const DeadlineOutcome o = reduce.reduce(grads, shares[static_cast<size_t>(me)], 0.0, Clock::now());
      // Member 1 fallen steps behind the leader's budgets of milliseconds (a loaded host)
      // is caught up to the leader's state; the leader never is. The record is then of the
      // step after the catch-up, applied to the chain, and its sum is applied here too as
      // the executor does (skipping it left member 1's weights a step apart for good).
      if (o.caught_up) REQUIRE(me == 1);
      if (o.ended || o.record.samples == 0) continue;
      const std::vector<float> sum = grads[0].to_vector();
      const float rescale = static_cast<float>(kGlobal) / static_cast<float>(o.record.samples);
      for (int i = 0; i < kN; ++i) weights[static_cast<size_t>(i)] -= 0.1f * sum[static_cast<size_t>(i)] * rescale;
    }
    if (me == 0) at_start[reduce.step()] = crc(weights);  // ahead, the leader may have ended first
    reduce.finish();
    const std::vector<std::string> told =
        group->allgather(me == 1 ? std::to_string(landed) + " " + landed_crc : "", kLong, "where member 1 landed");
    if (me == 0) {
      const auto space = told[1].find(' ');
      REQUIRE(space != std::string::npos);
      const int64_t at = std::stoll(told[1].substr(0, space));
      if (ahead) CHECK(at >= kTarget + 2);
      else CHECK(at == kTarget);
      REQUIRE(at_start.count(at));
      CHECK_MESSAGE(at_start[at] == told[1].substr(space + 1), "member 1's state at step ", at,
                    " is not the leader's at that step's start");
    } else {
      CHECK(passed == static_cast<size_t>(landed - kAsk));
    }
    const std::vector<std::string> all = group->allgather(crc(weights), kLong, "the weights' checksums");
    CHECK_MESSAGE(all[1] == all[0], "member 1's weights differ from member 0's at the end");
  }
}

TEST_CASE("deadline: a member stopped past its patience reads its leader's answer before suspecting the leader") {
  // Member 1 stops for kStop seconds right after its contribution to step 1 leaves (the
  // seam where a SIGSTOP from outside finds a waiting rank). The leader answers in that
  // time, with a gradient of 1 MiB: past OpenMPI's eager limits, so that it moves only
  // once member 1 polls again. On waking, member 1's patience is long spent, but it was
  // not there to hear: it waits on, takes the answer and the lead stays with rank 0. Its
  // patience for step 1 is max(2 x the plan's budget + 0.02, 2) = 2 s whatever the load
  // (the budget adapts only after three closed steps).
  constexpr double kStop = 4;
  constexpr int64_t kEnd = 5;
  constexpr int kBig = 1 << 18;  // floats: 1 MiB
  std::unique_ptr<Communicator> group = first_ranks(2);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(kBig, 0.5f);
  bool stop_now = false;
  DeadlineOptions options;
  options.predicted_step_s = 0.1;
  options.slack = 1;
  options.min_patience_s = 2;
  options.peer_timeout_s = 30;
  options.after_contribution = [&] {
    if (!stop_now) return;
    stop_now = false;
    std::this_thread::sleep_for(std::chrono::duration<double>(kStop));
  };
  const std::vector<int64_t> shares{5, 3};
  DeadlineReduce reduce(
      *group, options, shares, 0, [&] { return ReplicaState{weights, {}}; },
      [&](const ReplicaState& s) { weights = s.floats; });
  while (reduce.step() < kEnd) {
    const int64_t s = reduce.step();
    stop_now = me == 1 && s == 1;
    std::vector<float> g(kBig);
    for (int i = 0; i < kBig; ++i) g[static_cast<size_t>(i)] = weights[static_cast<size_t>(i)] - 0.01f * static_cast<float>(me + 1);
    std::vector<Tensor> grads{Tensor::from_vector(g, {kBig}, cpu_backend())};
    const DeadlineOutcome o = reduce.reduce(grads, shares[static_cast<size_t>(me)], 0.0, Clock::now());
    if (o.ended) break;
    CHECK_MESSAGE(reduce.term() == 0, "rank ", me, " moved to term ", reduce.term(), " at step ", s);
    CHECK(o.record.leader == 0);
    if (o.record.samples == 0) continue;
    const std::vector<float> sum = grads[0].to_vector();
    const float rescale = static_cast<float>(kGlobal) / static_cast<float>(o.record.samples);
    for (int i = 0; i < kBig; ++i) weights[static_cast<size_t>(i)] -= 0.1f * sum[static_cast<size_t>(i)] * rescale;
  }
  reduce.finish();
  CHECK(reduce.term() == 0);
  const std::vector<std::string> all =
      group->allgather(crc32_hex(crc32_update(0, weights.data(), weights.size() * sizeof(float))), kLong,
                       "the weights' checksums");
  CHECK_MESSAGE(all[1] == all[0], "member 1's weights differ from member 0's at the end");
}

// Rank 0 stops at step 2 until ranks 1 and 2 have trained on without it (rank 1 leading)
// and entered finish. There the leader waits for rank 0's report, so the members suspect
// each leader in turn, one patience (1 s) each, rank 0's every third term. Rank 0 returns
// about 2.5 s in, with both members' reports of the end queued among their word of the
// terms. It must not lead itself through the steps the others trained (and push its
// state on them as the end): it applies the results rank 1 sent it before giving up on
// it, if any, and then ends its training with their final state, whichever term it came
// back in. `while_leading`: the stop is inside the step rank 0 leads, else before the
// step. Whether rank 0 reads a report of the end while it leads a later term depends on
// the order its queued messages are read in, which this test does not fix; in that case
// it must not contribute to itself (send refuses it at once: the drain at the end would
// wait on that send until the peer timeout).
void run_back_after_the_end(bool while_leading) {
  constexpr int64_t kEnd = 12, kStopAt = 2;
  constexpr int kInFinishTag = 780;
  std::unique_ptr<Communicator> group = first_ranks(3);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(kN, 0.5f);
  bool returned = false;
  const DeadlineReduce* self = nullptr;
  auto stop = [&] {
    char in_finish = 0;
    for (int from : {1, 2}) REQUIRE(group->recv_bytes(&in_finish, 1, from, kInFinishTag, kLong) == WaitStatus::done);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    returned = true;
  };
  DeadlineOptions options;
  options.predicted_step_s = 0.005;
  options.slack = 0.5;
  options.min_patience_s = 1;
  options.peer_timeout_s = 30;
  if (while_leading && me == 0)
    options.while_leading = [&] {
      if (self->step() == kStopAt && !returned) stop();
    };
  const std::vector<int64_t> shares{5, 3, 2};
  DeadlineReduce reduce(
      *group, options, shares, 0, [&] { return ReplicaState{weights, {}}; },
      [&](const ReplicaState& s) { weights = s.floats; });
  self = &reduce;
  while (reduce.step() < kEnd) {
    const int64_t s = reduce.step();
    if (!while_leading && me == 0 && s == kStopAt && !returned) stop();
    std::vector<Tensor> grads{Tensor::from_vector(contribution(me, s, weights), {kN}, cpu_backend())};
    const DeadlineOutcome o = reduce.reduce(grads, shares[static_cast<size_t>(me)], 0.0, Clock::now());
    // The step rank 0 was stopped inside it closes with what had arrived (the members'
    // contributions come before their word of the next term).
    if (returned && !o.ended && !(while_leading && s == kStopAt))
      CHECK_MESSAGE(o.record.leader != 0, "rank 0, back at step ", kStopAt, ", led step ", o.record.step,
                    " itself after the others had ended");
    if (o.ended) break;
    if (o.record.samples == 0) continue;
    const std::vector<float> sum = grads[0].to_vector();
    const float rescale = static_cast<float>(kGlobal) / static_cast<float>(o.record.samples);
    for (int i = 0; i < kN; ++i) weights[static_cast<size_t>(i)] -= 0.1f * sum[static_cast<size_t>(i)] * rescale;
  }
  if (me == 0) CHECK(returned);
  const std::string before = crc32_hex(crc32_update(0, weights.data(), kN * sizeof(float)));
  if (me != 0) {
    static const char kIn = 1;
    group->send_bytes(&kIn, 1, 0, kInFinishTag, kLong, "word that this rank is in finish");
  }
  reduce.finish();
  CHECK(reduce.step() == kEnd);
  const std::string after = crc32_hex(crc32_update(0, weights.data(), kN * sizeof(float)));
  // The members' end is the job's: they keep the state they finished with, and rank 0 has it.
  if (me != 0) CHECK_MESSAGE(after == before, "rank ", me, "'s final state was replaced at the end");
  const std::vector<std::string> all = group->allgather(after, kLong, "the weights' checksums");
  for (size_t j = 1; j < all.size(); ++j) CHECK_MESSAGE(all[j] == all[0], "member ", j, "'s weights differ from rank 0's");
}

TEST_CASE("deadline: a leader back from a stop the others trained through to the end takes their final state") {
  run_back_after_the_end(false);
}

TEST_CASE("deadline: a leader stopped inside its step, back after the others' end, takes their final state") {
  run_back_after_the_end(true);
}

TEST_CASE("deadline: a contribution resent to the next term's leader is not applied again as a stale one") {
  // Rank 0 leads; its results reach rank 2 a second late (an emulated link), so rank 2
  // gives up on them and resends its contribution to rank 1, the next term's leader,
  // which had already applied the step that took it. With max_staleness above 0 that
  // resend fits the staleness window on rank 1's chain; it must not be added again. The
  // verdict holds whatever the timing: no record of the chain names one member's
  // contribution to one step twice.
  std::unique_ptr<Communicator> group = first_ranks(3);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(64, 0.5f);
  DeadlineOptions o;
  o.predicted_step_s = 0.02;
  o.slack = 0.5;
  o.max_staleness = 10;
  o.peer_timeout_s = 60;
  DeadlineReduce r(*group, o, {1, 1, 1}, 0, [&] { return ReplicaState{weights, {}}; },
                   [&](const ReplicaState& s) { weights = s.floats; });
  REQUIRE(group->barrier(kLong) == WaitStatus::done);
  if (me == 0) {
    std::vector<LinkEmulation> links(3);
    links[2].latency_s = 1.0;
    group->set_link_emulation(links);
  }
  std::vector<StepRecord> records;
  while (r.step() < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    std::vector<Tensor> g{Tensor::from_vector(std::vector<float>(64, 0.01f * static_cast<float>(me + 1)), {64},
                                              cpu_backend())};
    DeadlineOutcome out = r.reduce(g, 1, 0.0, Clock::now());
    for (const StepRecord& m : out.missed) records.push_back(m);
    if (out.ended) break;
    records.push_back(out.record);
    if (me == 0 && r.step() == 2) group->set_link_emulation({});
  }
  for (const StepRecord& m : r.finish()) records.push_back(m);
  std::set<int64_t> steps;
  std::set<std::pair<int, int64_t>> applied;  // (member, the step its contribution was computed for)
  int twice = 0;
  for (const StepRecord& rec : records) {
    if (!steps.insert(rec.step).second) continue;  // one record per step of the chain
    for (const Contribution& c : rec.contributors)
      if (c.samples > 0 && !applied.insert({c.rank, rec.step - c.staleness}).second) ++twice;
  }
  CHECK(twice == 0);
  if (me == 0) group->set_link_emulation({});
  REQUIRE(group->barrier(kLong) == WaitStatus::done);
}

namespace {

// The finish tests' toy gradient: member `me`'s 0.01 (me + 1) in every one of 64 values.
std::vector<Tensor> toy_gradient(int me) {
  return {Tensor::from_vector(std::vector<float>(64, 0.01f * static_cast<float>(me + 1)), {64}, cpu_backend())};
}

// Steps `r` to step `until` on the toy gradients, applying each sum to `weights`.
void step_to(DeadlineReduce& r, std::vector<float>& weights, int me, int64_t until) {
  while (r.step() < until) {
    std::vector<Tensor> g = toy_gradient(me);
    const DeadlineOutcome out = r.reduce(g, 1, 0.0, Clock::now());
    REQUIRE_FALSE(out.ended);
    const std::vector<float> sum = g[0].to_vector();
    for (size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.1f * sum[i];
  }
}

// Whether every member of `group` ended on this rank's chain (collective).
bool one_chain(Communicator& group, const DeadlineReduce& r) {
  const std::vector<std::string> hashes = group.allgather(std::to_string(r.chain_hash()), kLong, "the chain hashes");
  return std::all_of(hashes.begin(), hashes.end(), [&](const std::string& h) { return h == hashes[0]; });
}

}  // namespace

TEST_CASE("deadline: a member's stop ends the chain at its step at once, the leader taking its state") {
  // Four members, one leader (rank 0: the patience is long, so no term changes). Member
  // 2 stops after step 5 (a signal: finish as a stop). The leader hears its `done` in
  // the step it leads next and takes its state, so no rank applies more than one step
  // past it, and every rank ends at step 5 on one chain. (The stop once reached the
  // others only when the term came round to the stopped member, a patience per member:
  // with 8 members they reached step 49, and each of those steps was thrown away.)
  constexpr int64_t kStop = 5;
  std::unique_ptr<Communicator> group = first_ranks(4);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(64, 0.5f);
  DeadlineOptions o;
  o.predicted_step_s = 0.02;
  o.peer_timeout_s = 30;
  o.min_patience_s = 10;
  DeadlineReduce r(*group, o, std::vector<int64_t>(4, 1), 0, [&] { return ReplicaState{weights, {}}; },
                   [&](const ReplicaState& s) { weights = s.floats; });
  REQUIRE(group->barrier(kLong) == WaitStatus::done);
  int64_t highest = 0;
  bool ended = false;
  while (r.step() < 1000) {
    if (me == 2 && r.step() == kStop) break;
    std::vector<Tensor> g = toy_gradient(me);
    const DeadlineOutcome out = r.reduce(g, 1, 0.0, Clock::now());
    highest = std::max(highest, r.step());
    if (out.ended) {
      ended = true;
      break;
    }
    const std::vector<float> sum = g[0].to_vector();
    for (size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.1f * sum[i];
  }
  r.finish(me == 2 ? DeadlineReduce::FinishReason::stop : DeadlineReduce::FinishReason::propagated);
  CHECK(r.step() == kStop);
  CHECK(highest <= kStop + 1);
  if (me != 2) CHECK(ended);
  CHECK(one_chain(*group, r));
}

TEST_CASE("deadline: a member in finish that hears of a later term reports to its leader at once") {
  // Three members end training together, and rank 0, the leader, is away for 4 s before
  // it takes their reports of the end. Rank 1 (patience 1 s) suspects it and leads term
  // 1; rank 2 (patience 30 s) hears of term 1 from rank 1's notice and must report to
  // rank 1 then, not when its own patience runs out (which moved the term on again: with
  // every member doing so, a leader could wait out each term without some report, and
  // the job failed at the timeout). Rank 0 is back after 4 s, ahead of rank 2's patience
  // by 26 s, and every rank ends in term 1.
  std::unique_ptr<Communicator> group = first_ranks(3);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(64, 0.5f);
  DeadlineOptions o;
  o.predicted_step_s = 0.02;
  o.peer_timeout_s = 60;
  o.min_patience_s = me == 1 ? 1 : 30;
  DeadlineReduce r(*group, o, {1, 1, 1}, 0, [&] { return ReplicaState{weights, {}}; },
                   [&](const ReplicaState& s) { weights = s.floats; });
  REQUIRE(group->barrier(kLong) == WaitStatus::done);
  step_to(r, weights, me, 3);
  REQUIRE(r.term() == 0);
  if (me == 0) std::this_thread::sleep_for(std::chrono::seconds(4));
  const auto start = Clock::now();
  r.finish();
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK_MESSAGE(r.term() == 1, "rank ", me, " ended in term ", r.term(), " after ", took, " s in finish");
  CHECK(r.step() == 3);
  CHECK(one_chain(*group, r));
}

TEST_CASE("deadline: a request to align past the end is answered with the end by a finishing leader") {
  // Rank 0 leads 3 steps and finishes (the end of its chain); member 1, behind its
  // replica's other stages on a hybrid plan, asks to align to step 10, which this chain
  // will not reach. The leader answers with its final state and the end, at once: held
  // for step 10, the request was answered by no one, and member 1 moved the lead from
  // term to term until the peer timeout. Both end on one chain at step 3.
  std::unique_ptr<Communicator> group = first_ranks(2);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(64, 0.5f);
  DeadlineOptions o;
  o.predicted_step_s = 0.02;
  o.peer_timeout_s = 20;
  o.min_patience_s = 1;
  DeadlineReduce r(*group, o, {1, 1}, 0, [&] { return ReplicaState{weights, {}}; },
                   [&](const ReplicaState& s) { weights = s.floats; });
  REQUIRE(group->barrier(kLong) == WaitStatus::done);
  step_to(r, weights, me, 3);
  const auto start = Clock::now();
  if (me == 1) {
    const DeadlineOutcome out = r.align_to(10);
    CHECK(out.ended);
  }
  r.finish();
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK_MESSAGE(took < 10, "rank ", me, " took ", took, " s to end");
  CHECK(r.step() == 3);
  CHECK(one_chain(*group, r));
}

TEST_CASE("deadline: a member back from a stop, steps behind, is not waited for until it is back in step") {
  // Three members, rank 0 leading. Member 2 is away from step 0 until the others reach
  // step 8; back, it steps through the results queued for it and contributes to step 3,
  // five steps behind, and is held right after that contribution until the leader has
  // closed step 13. The budget is long (each member's step takes 5 ms, slack 10^4: 50 s
  // and more once three steps are measured, past the 10 s peer timeout), so a leader that
  // waited for it would fail at the timeout: a contribution steps late was taken as a slow
  // member's (waited for again), and a catch-up sent made its receiver waited for too,
  // which held each step after a 5 s stop to its budget until the member was back in step.
  // It is back in step by a catch-up, and contributes samples again before the end.
  constexpr int kGo1 = 781, kGo2 = 782;
  constexpr int64_t kBack = 8, kHeldUntil = 13, kEnd = 40;
  std::unique_ptr<Communicator> group = first_ranks(3);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(64, 0.5f);
  bool held = false;
  DeadlineOptions o;
  o.predicted_step_s = 1e-6;  // 10 ms budgets until three steps are measured
  o.slack = 1e4;
  o.peer_timeout_s = 10;
  if (me == 2)
    o.after_contribution = [&] {
      if (held) return;
      held = true;
      char go = 0;
      REQUIRE(group->recv_bytes(&go, 1, 0, kGo2, kLong) == WaitStatus::done);
    };
  DeadlineReduce r(*group, o, {1, 1, 1}, 0, [&] { return ReplicaState{weights, {}}; },
                   [&](const ReplicaState& s) { weights = s.floats; });
  REQUIRE(group->barrier(kLong) == WaitStatus::done);
  if (me == 2) {
    char go = 0;
    REQUIRE(group->recv_bytes(&go, 1, 0, kGo1, kLong) == WaitStatus::done);
  }
  static const char kGo = 1;
  bool rejoined = false;  // the leader's records: member 2 contributed samples after its hold
  while (r.step() < kEnd) {
    if (me == 0 && r.step() == kBack) group->send_bytes(&kGo, 1, 2, kGo1, kLong, "member 2's return");
    if (me == 0 && r.step() == kHeldUntil) group->send_bytes(&kGo, 1, 2, kGo2, kLong, "member 2's release");
    const auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the step's compute
    std::vector<Tensor> g = toy_gradient(me);
    const DeadlineOutcome out = r.reduce(g, 1, 0.0, start);
    REQUIRE_FALSE(out.ended);
    for (const Contribution& c : out.record.contributors)
      if (c.rank == 2 && c.samples > 0 && out.record.step > kHeldUntil) rejoined = true;
    const std::vector<float> sum = g[0].to_vector();
    for (size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.1f * sum[i];
  }
  r.finish();
  CHECK(r.step() == kEnd);
  if (me == 0) CHECK(rejoined);
  if (me == 2) CHECK(held);
  CHECK(one_chain(*group, r));
}

TEST_CASE("deadline: a leader's re-split reaches every member, by the step's record or by a catch-up") {
  // Three members at shares 5/3/2. A leader that has closed step 6 or later under 5/3/2
  // decides 6/2/2 (DeadlineOptions::reshare), and the record of the next step it closes
  // carries it: the shares from the step after that. Members 0 and 1 apply it with that
  // record. Member 2 is away from step 0 until the others reach step 12, past the
  // kSendTo results a leader queues for a silent member: it has the new shares only from
  // the catch-up its return gets, which must carry the shares in force. Each member
  // contributes its share in force, and its measures (set_report) reach the leader as
  // sent.
  constexpr int kGo1 = 783;
  constexpr int64_t kSplitFrom = 6, kBack = 12, kEnd = 30;
  const std::vector<int64_t> first{5, 3, 2}, after{6, 2, 2};
  std::unique_ptr<Communicator> group = first_ranks(3);
  if (!group) return;
  const int me = group->rank();
  std::vector<float> weights(64, 0.5f);
  int reports = 0, bad_reports = 0;
  DeadlineOptions o;
  o.predicted_step_s = 1e-6;  // 10 ms budgets until three steps are measured
  o.slack = 1e4;
  o.peer_timeout_s = 10;
  o.on_report = [&](int member, int64_t step, std::span<const double> row) {
    ++reports;
    if (row.size() != 2 || row[0] != member || row[1] > static_cast<double>(step)) ++bad_reports;
  };
  o.reshare = [&](int64_t step, const std::vector<int64_t>& shares) {
    return step >= kSplitFrom && shares == first ? after : std::vector<int64_t>{};
  };
  DeadlineReduce r(*group, o, first, 0, [&] { return ReplicaState{weights, {}}; },
                   [&](const ReplicaState& s) { weights = s.floats; });
  REQUIRE(group->barrier(kLong) == WaitStatus::done);
  if (me == 2) {
    char go = 0;
    REQUIRE(group->recv_bytes(&go, 1, 0, kGo1, kLong) == WaitStatus::done);
  }
  static const char kGo = 1;
  bool caught_up = false;
  int split_records = 0, wrong_samples = 0, wrong_shares = 0;
  while (r.step() < kEnd) {
    if (me == 0 && r.step() == kBack) group->send_bytes(&kGo, 1, 2, kGo1, kLong, "member 2's return");
    const auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the step's compute
    r.set_report({static_cast<double>(me), static_cast<double>(r.step())});
    const std::vector<int64_t> in_force = r.shares();
    std::vector<Tensor> g = toy_gradient(me);
    const DeadlineOutcome out = r.reduce(g, in_force[static_cast<size_t>(me)], 0.0, start);
    REQUIRE_FALSE(out.ended);
    caught_up = caught_up || out.caught_up;
    if (!out.record.shares.empty()) {
      ++split_records;
      CHECK(out.record.step > kSplitFrom);
      CHECK(out.record.shares == after);
    }
    if (!out.caught_up) {
      for (const Contribution& c : out.record.contributors)
        if (c.staleness == 0 && c.samples > 0 && c.samples != in_force[static_cast<size_t>(c.rank)]) ++wrong_samples;
      if (r.shares() != (out.record.shares.empty() ? in_force : after)) ++wrong_shares;
    }
    const std::vector<float> sum = g[0].to_vector();
    for (size_t i = 0; i < weights.size(); ++i) weights[i] -= 0.1f * sum[i];
  }
  r.finish();
  CHECK(r.shares() == after);
  CHECK(wrong_samples == 0);
  CHECK(wrong_shares == 0);
  if (me == 2) CHECK(caught_up);
  if (me != 2) CHECK(split_records == 1);
  if (r.leader() == me) CHECK((reports > 0 && bad_reports == 0));
  CHECK(one_chain(*group, r));
}
