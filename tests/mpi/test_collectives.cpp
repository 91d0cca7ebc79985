// Collectives over MPI: sums, allgather, split groups, a barrier that times out, shared memory.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/shared_memory.h"
#include "comm/weighted_allreduce.h"
#include "core/error.h"
#include "mpi_util.h"
#include "ops/ops.h"

using namespace ht;
using namespace ht::comm;
using namespace mpi_test;

namespace {

// Integer-valued floats (sums stay below 2^24), so the sums are exact in any order.
float value(int64_t i, size_t bucket, int rank) {
  return static_cast<float>((rank + 1) * ((i % 97) + static_cast<int64_t>(bucket)));
}

std::vector<Tensor> make_buckets(const std::vector<int64_t>& sizes, int rank) {
  std::vector<Tensor> out;
  for (size_t b = 0; b < sizes.size(); ++b) {
    std::vector<float> v(static_cast<size_t>(sizes[b]));
    for (int64_t i = 0; i < sizes[b]; ++i) v[static_cast<size_t>(i)] = value(i, b, rank);
    out.push_back(Tensor::from_vector(v, {sizes[b]}, cpu_backend()));
  }
  return out;
}

// Elements that differ from the sum over all p ranks.
int64_t wrong_sums(const std::vector<Tensor>& buckets, int p) {
  int64_t wrong = 0;
  const float ranks_sum = static_cast<float>(p * (p + 1) / 2);
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::vector<float> v = buckets[b].to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      wrong += v[i] != value(static_cast<int64_t>(i), b, 0) * ranks_sum;
  }
  return wrong;
}

}  // namespace

TEST_CASE("collectives: allreduce_sum over several buckets of 1 to 1e6 elements is exact") {
  Communicator& w = world();
  const std::vector<int64_t> sizes{1, 3, 1000, 65537, 1000000};
  SUBCASE("in place") {
    std::vector<Tensor> buckets = make_buckets(sizes, w.rank());
    REQUIRE(w.allreduce_sum(buckets, kLong) == WaitStatus::done);
    CHECK(wrong_sums(buckets, w.size()) == 0);
  }
  SUBCASE("staged, with a deadline") {
    std::vector<Tensor> buckets = make_buckets(sizes, w.rank());
    REQUIRE(w.allreduce_sum(buckets, kLong) == WaitStatus::done);
    CHECK(wrong_sums(buckets, w.size()) == 0);
  }
  SUBCASE("a strided bucket") {
    Tensor base = Tensor::full({4, 5}, static_cast<float>(w.rank() + 1), cpu_backend());
    std::vector<Tensor> buckets{transpose(base, 0, 1)};
    REQUIRE(w.allreduce_sum(buckets, kLong) == WaitStatus::done);
    CHECK(base.to_vector() ==
          std::vector<float>(20, static_cast<float>(w.size() * (w.size() + 1) / 2)));
  }
  std::vector<Tensor> ints{Tensor::from_ints({1}, {1}, cpu_backend())};
  CHECK_THROWS_WITH_AS(w.allreduce_sum(ints, kLong),
                       doctest::Contains("bucket 0 of shape [1] is int32; expected float32"),
                       Error);
}

TEST_CASE("collectives: allgather returns every rank's string in rank order") {
  Communicator& w = world();
  const std::string mine =
      "rank-" + std::to_string(w.rank()) + std::string(static_cast<size_t>(w.rank()) * 10, 'x');
  const std::vector<std::string> all = w.allgather(mine, kLong, "the test items");
  REQUIRE(static_cast<int>(all.size()) == w.size());
  for (int r = 0; r < w.size(); ++r)
    CHECK(all[static_cast<size_t>(r)] ==
          "rank-" + std::to_string(r) + std::string(static_cast<size_t>(r) * 10, 'x'));
  CHECK(w.allgather("", kLong, "the test items") == std::vector<std::string>(static_cast<size_t>(w.size())));
}

TEST_CASE("consult: rank 0 answers every rank's item, two consultations in flight keep their order") {
  Communicator& w = world();
  auto first = w.consult(std::string("a").append(std::to_string(w.rank())));
  auto second = w.consult(std::string(static_cast<size_t>(w.rank()) * 100000, 'b'));  // 0 to 300 kB
  int calls = 0;
  const std::string got = first->finish([&](const std::vector<std::string>& items) {
    ++calls;
    std::string joined;
    for (const std::string& x : items) joined.append(x).append(",");
    return joined;
  }, kLong, "the first test consultation");
  std::string want;
  for (int r = 0; r < w.size(); ++r) want.append("a").append(std::to_string(r)).append(",");
  CHECK(got == want);
  CHECK(calls == (w.rank() == 0 ? 1 : 0));
  const std::string sizes = second->finish([](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& x : items)
      out.append(std::to_string(x.size())).append(x.find_first_not_of('b') == std::string::npos ? " " : "? ");
    return out;
  }, kLong, "the second test consultation");
  CHECK(sizes == "0 100000 200000 300000 ");
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("consult: rank 0's answer waits for the items, not for the ranks to come for it") {
  // The point of consult over allgather: a rank that is late to finish (still in its
  // next training step) does not hold rank 0, whose finish needs only what was sent.
  // Rank 1 finishes only after rank 0's finish has returned and told it so, so the
  // order proves it whatever the timing: an allgather-like finish would time out.
  Communicator& w = world();
  auto c = w.consult(std::to_string(w.rank()));
  int word = 0;
  if (w.rank() == 1)
    REQUIRE(w.recv_bytes(&word, sizeof word, 0, 51, kLong) == WaitStatus::done);
  const std::string a = c->finish([](const std::vector<std::string>& items) { return std::to_string(items.size()); },
                                w.rank() == 0 ? 10s : kLong, "the test consultation");
  if (w.rank() == 0) {
    word = 1;
    w.send_bytes(&word, sizeof word, 1, 51, kLong, "the word that rank 0's answer is out");
  }
  CHECK(a == std::to_string(w.size()));
  if (w.rank() == 1) CHECK(word == 1);
  c.reset();
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("collectives: split forms groups by color, ordered by key") {
  Communicator& w = world();
  // Colors by parity; keys reverse the order inside each group.
  auto sub = w.split(w.rank() % 2, -w.rank(), kLong, "the test groups");
  REQUIRE(sub.get() != nullptr);
  std::vector<int> members;  // world ranks of my group, in sub-rank order
  for (int r = w.size() - 1; r >= 0; --r)
    if (r % 2 == w.rank() % 2) members.push_back(r);
  CHECK(sub->size() == static_cast<int>(members.size()));
  CHECK(members[static_cast<size_t>(sub->rank())] == w.rank());
  CHECK(sub->local_size() == w.local_size());
  std::vector<std::string> want;
  for (int r : members) want.push_back(std::to_string(r));
  CHECK(sub->allgather(std::to_string(w.rank()), kLong, "the test items") == want);
  std::vector<Tensor> one{Tensor::full({2}, static_cast<float>(w.rank()), cpu_backend())};
  REQUIRE(sub->allreduce_sum(one, kLong) == WaitStatus::done);
  float sum = 0;
  for (int r : members) sum += static_cast<float>(r);
  CHECK(one[0].to_vector() == std::vector<float>{sum, sum});
  // Point to point inside the group uses the group's ranks.
  if (sub->size() >= 2) {
    int token = w.rank(), got = -1;
    const int next = (sub->rank() + 1) % sub->size(),
              prev = (sub->rank() + sub->size() - 1) % sub->size();
    Request s = sub->isend_bytes(&token, sizeof token, next, 3);
    CHECK(sub->recv_bytes(&got, sizeof got, prev, 3, kLong) == WaitStatus::done);
    CHECK(s.wait(kLong) == WaitStatus::done);
    CHECK(got == members[static_cast<size_t>(prev)]);
  }

  // A negative color joins no group.
  const bool out = w.rank() == w.size() - 1;
  auto rest = w.split(out ? -1 : 0, w.rank(), kLong, "the test groups");
  CHECK((rest.get() == nullptr) == out);
  if (rest) CHECK(rest->size() == w.size() - 1);
  CHECK(w.barrier(kLong) == WaitStatus::done);
}

TEST_CASE("collectives: a barrier that one member skips times out, and its group is abandoned") {
  Communicator& w = world();
  REQUIRE(w.size() >= 2);
  auto sub = w.split(w.rank() < 2 ? 0 : 1, w.rank(), kLong, "the test groups");
  REQUIRE(sub.get() != nullptr);
  if (w.rank() == 0) {
    const auto t0 = Clock::now();
    CHECK(sub->barrier(0.2s) == WaitStatus::timed_out);
    const double took = seconds_since(t0);
    CHECK(took >= 0.2);  // how late it returns depends on the load, not the code
    CHECK_THROWS_WITH_AS(
        sub->barrier(kLong),
        doctest::Contains("barrier: this communicator is unusable since barrier timed out"), Error);
    std::vector<Tensor> b{Tensor::zeros({1}, cpu_backend())};
    CHECK_THROWS_WITH_AS(sub->allreduce_sum(b, kLong),
                         doctest::Contains("allreduce_sum: this communicator is unusable"), Error);
  } else if (w.rank() >= 2) {
    CHECK(sub->barrier(kLong) == WaitStatus::done);  // the other group is unaffected
  }
  // Rank 1 never enters its group's barrier. The world still works.
  CHECK(w.barrier(kLong) == WaitStatus::done);
  std::vector<Tensor> b{Tensor::full({1}, 1.f, cpu_backend())};
  CHECK(w.allreduce_sum(b, kLong) == WaitStatus::done);
  CHECK(b[0].to_vector() == std::vector<float>{static_cast<float>(w.size())});
}

TEST_CASE("weighted all-reduce: exact sums for uneven weights, tiny, empty and absent parts") {
  Communicator& world = ht::comm::world();
  const int p = world.size();
  for (const std::vector<double>& weights :
       {std::vector<double>{8, 4, 2, 2}, std::vector<double>{1, 1, 1, 1}, std::vector<double>{1000, 1, 1, 1},
        std::vector<double>{0, 0, 1, 0}, std::vector<double>{3, 0, 1, 0}}) {
    CAPTURE(weights[0]);
    CAPTURE(weights[1]);
    std::vector<Tensor> buckets = make_buckets({1, 3, 1000, 4097}, world.rank());
    REQUIRE(allreduce_sum_weighted(world, buckets, weights, kLong) == WaitStatus::done);
    CHECK(wrong_sums(buckets, p) == 0);
  }
  std::vector<Tensor> one = make_buckets({10}, world.rank());
  CHECK_THROWS_WITH_AS(allreduce_sum_weighted(world, one, {1, 2}, kLong), doctest::Contains("2 weights for 4 ranks"), Error);
  CHECK_THROWS_WITH_AS(allreduce_sum_weighted(world, one, {1, -1, 1, 1}, kLong), doctest::Contains("weight -1; expected >= 0"), Error);
  CHECK_THROWS_WITH_AS(allreduce_sum_weighted(world, one, {0, 0, 0, 0}, kLong), doctest::Contains("every weight is 0"), Error);
}

TEST_CASE("weighted all-reduce: a lone owner's finish does not wait for a late receiver") {
  Communicator& world = ht::comm::world();
  const int p = world.size();
  OverlappedAllreduce reduce(world, {1, 0, 0, 0});
  std::vector<Tensor> buckets = make_buckets({1000, 40000}, world.rank());
  reduce.add(buckets);
  if (world.rank() == 1) {
    // Round 1 (its gradients to rank 0) completes; then it is late for the sums.
    const auto t0 = Clock::now();
    while (seconds_since(t0) < 0.1) reduce.progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  const auto t0 = Clock::now();
  REQUIRE(reduce.finish(kLong) == WaitStatus::done);
  if (world.rank() == 0) CHECK(seconds_since(t0) < 0.3);  // rank 1 is still asleep
  REQUIRE(reduce.drain(kLong) == WaitStatus::done);
  CHECK(wrong_sums(buckets, p) == 0);
}

TEST_CASE("weighted all-reduce: scatter_only sums each rank's part, then gather spreads new values") {
  Communicator& world = ht::comm::world();
  const int p = world.size(), me = world.rank();
  const std::vector<double> weights{0.5, 0.3, 0.2, 0};  // rank 3 owns nothing
  const std::vector<int64_t> sizes{1, 3, 1000, 4097};
  OverlappedAllreduce reduce(world, weights, true);
  std::vector<Tensor> grads = make_buckets(sizes, me);
  reduce.add({grads[0], grads[1]});
  reduce.add({grads[2], grads[3]});
  REQUIRE(reduce.finish(kLong) == WaitStatus::done);
  // This rank's part holds the sums, the rest its own values.
  const float ranks_sum = static_cast<float>(p * (p + 1) / 2);
  int64_t wrong = 0;
  std::vector<Tensor> weights_out;
  for (size_t b = 0; b < sizes.size(); ++b) {
    const std::vector<int64_t> off = part_offsets(sizes[b], weights);
    const std::vector<float> v = grads[b].to_vector();
    std::vector<float> mine(v.size(), -1);
    for (int64_t i = 0; i < sizes[b]; ++i) {
      const bool owned = i >= off[static_cast<size_t>(me)] && i < off[static_cast<size_t>(me) + 1];
      const float want = value(i, b, 0) * (owned ? ranks_sum : static_cast<float>(me + 1));
      wrong += v[static_cast<size_t>(i)] != want;
      if (owned) mine[static_cast<size_t>(i)] = 2 * v[static_cast<size_t>(i)];  // "the update"
    }
    weights_out.push_back(Tensor::from_vector(mine, {sizes[b]}, cpu_backend()));
  }
  CHECK(wrong == 0);
  // Round 2 spreads every owner's updated part: all ranks end with twice the sums.
  CHECK_THROWS_WITH_AS(reduce.gather({weights_out[0]}), doctest::Contains("1 sources for 4 tensors"), Error);
  reduce.gather(weights_out);
  REQUIRE(reduce.finish(kLong) == WaitStatus::done);
  REQUIRE(reduce.drain(kLong) == WaitStatus::done);
  wrong = 0;
  for (size_t b = 0; b < sizes.size(); ++b) {
    const std::vector<float> v = weights_out[b].to_vector();
    for (size_t i = 0; i < v.size(); ++i) wrong += v[i] != 2 * value(static_cast<int64_t>(i), b, 0) * ranks_sum;
  }
  CHECK(wrong == 0);
}

TEST_CASE("shared memory: one rank's memory is every rank's, or nobody's, with the reason") {
  Communicator& world = ht::comm::world();
  const int p = world.size(), me = world.rank(), owner = 2;
  constexpr size_t kFloats = 3000;  // more than a page
  std::string why;
  std::shared_ptr<std::byte> memory = map_shared(world, owner, kFloats * sizeof(float), true, kLong, &why);
  REQUIRE_MESSAGE(memory, why);
  // The owner's tensor moves in; the others take what is there, and write their own slot.
  std::vector<float> v(kFloats);
  for (size_t i = 0; i < kFloats; ++i) v[i] = me == owner ? static_cast<float>(i) : -1.f;
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(kFloats)}, cpu_backend());
  const Tensor view = t;  // a handle made before: it follows, as the parameters' holders do
  t.move_to(memory.get(), memory, me == owner);
  REQUIRE(world.barrier(kLong) == WaitStatus::done);
  CHECK(view.data() == reinterpret_cast<float*>(memory.get()));
  const std::vector<float> seen = view.to_vector();
  int64_t wrong = 0;
  for (size_t i = 0; i < kFloats; ++i) wrong += seen[i] != static_cast<float>(i);
  CHECK(wrong == 0);
  REQUIRE(world.barrier(kLong) == WaitStatus::done);
  t.data()[kFloats - 1 - static_cast<size_t>(me)] = static_cast<float>(100 + me);
  REQUIRE(world.barrier(kLong) == WaitStatus::done);
  const std::vector<float> written = t.to_vector();
  for (int r = 0; r < p; ++r) CHECK(written[kFloats - 1 - static_cast<size_t>(r)] == static_cast<float>(100 + r));
  REQUIRE(world.barrier(kLong) == WaitStatus::done);

  // One rank unwilling: nobody maps, and all say which.
  why.clear();
  CHECK_FALSE(map_shared(world, owner, 64, me != 1, kLong, &why));
  CHECK(why == "rank 1 keeps its own copy");
  // Emulated links: the bytes would bypass them.
  std::vector<LinkEmulation> links(static_cast<size_t>(p));
  links[3].latency_s = 1e-6;
  auto emulated = world.split(0, me, kLong, "the test groups");
  emulated->set_link_emulation(links);
  why.clear();
  CHECK_FALSE(map_shared(*emulated, owner, 64, true, kLong, &why));
  CHECK(why.find("emulated") != std::string::npos);
  CHECK_THROWS_WITH_AS(map_shared(world, p, 64, true, kLong), doctest::Contains("owner 4 of 4 ranks"), Error);
}
