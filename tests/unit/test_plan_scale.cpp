// The planner at scale (issue 23): the all-reduce priced per link tier against the pairwise
// form it replaced, the tiers themselves, and the local group search by device class on
// thousands of ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>

#include "plan/local_plan.h"
#include "plan/plan_costs.h"
#include "plan/planner.h"
#include "tests/unit/plan_fixtures.h"

using namespace ht;
using namespace ht::plan;
using namespace ht::plan::fixtures;

namespace {

// The pairwise form the tiers replaced (every member against every other, O(n^2)), as a
// reference: the tiered form must give the same bits.
double pairwise_allreduce_seconds(const ClusterModel& cluster, const std::vector<int>& group,
                                  const std::vector<double>& parts, double bytes) {
  const size_t n = group.size();
  if (n <= 1) return 0;
  double latency = 0, round = 0, owner_wake = 0, any_wake = 0;
  for (size_t i = 0; i < n; ++i) {
    const double wake = wake_seconds(cluster.ranks[static_cast<size_t>(group[i])]);
    any_wake = std::max(any_wake, wake);
    if (parts[i] > 0) owner_wake = std::max(owner_wake, wake);
    double slowest_bw = 0;
    for (size_t j = 0; j < n; ++j) {
      if (i == j || (parts[i] <= 0 && parts[j] <= 0)) continue;
      const auto a = static_cast<size_t>(group[i]), b = static_cast<size_t>(group[j]);
      latency = std::max(latency, cluster.links.latency(a, b));
      const double bw = cluster.links.bandwidth(a, b);
      if (slowest_bw == 0 || bw < slowest_bw) slowest_bw = bw;
    }
    const double moved = std::max(1 - parts[i], static_cast<double>(n - 1) * parts[i]) * bytes;
    if (slowest_bw > 0) round = std::max(round, moved / slowest_bw);
  }
  return 2 * (latency + round) + owner_wake + any_wake;
}

// n ranks on `sites` sites: links within a site and between two sites drawn once from a
// few figures, so that ranks of a site share a tier; some ranks throttled. Its links by
// site (the compact form, Links::by_site).
ClusterModel random_cluster(std::mt19937& rng, size_t n, size_t sites) {
  ClusterModel c = cluster(std::vector<double>(n, 1e12), std::vector<double>(n, 64 * kGiB));
  std::uniform_int_distribution<size_t> pick_site(0, sites - 1);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<size_t> site(n);
  for (size_t& s : site) s = pick_site(rng);
  std::vector<std::vector<double>> lat(sites, std::vector<double>(sites)), bw = lat;
  for (size_t a = 0; a < sites; ++a)
    for (size_t b = a; b < sites; ++b) {
      lat[a][b] = lat[b][a] = (a == b ? 1e-6 : 1e-3) * (1 + unit(rng));
      bw[a][b] = bw[b][a] = (a == b ? 1e10 : 1e8) * (1 + unit(rng));
    }
  c.links = Links::by_site(site, lat, bw);
  for (DeviceModel& d : c.ranks)
    if (unit(rng) < 0.3) {
      d.cpu_quota = unit(rng);
      d.cpu_quota_period_s = 0.01;
    }
  return c;
}

// The same links as dense matrices (a site per rank, as a probe file's).
ClusterModel dense(const ClusterModel& c) {
  const size_t n = c.ranks.size();
  std::vector<std::vector<double>> lat(n, std::vector<double>(n)), bw = lat;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) lat[i][j] = c.links.latency(i, j), bw[i][j] = c.links.bandwidth(i, j);
  ClusterModel d = c;
  d.links = Links::from_matrices(lat, bw);
  return d;
}

// The tiers as every pair compares them (the definition, O(ranks^2 x tiers)): a tier per
// rank unless the links are symmetric, else a rank joins the first tier whose first rank
// has its links to every third rank.
LinkTiers pairwise_tiers(const ClusterModel& c, const std::vector<int>& ranks) {
  const size_t m = ranks.size();
  const Links& l = c.links;
  const auto at = [&](size_t p) { return static_cast<size_t>(ranks[p]); };
  bool symmetric = true;
  for (size_t a = 0; a < m; ++a)
    for (size_t b = 0; b < m; ++b)
      if (a != b && (l.latency(at(a), at(b)) != l.latency(at(b), at(a)) ||
                     l.bandwidth(at(a), at(b)) != l.bandwidth(at(b), at(a))))
        symmetric = false;
  LinkTiers t;
  std::vector<size_t> first_at;
  for (size_t p = 0; p < m; ++p) {
    int tier = -1;
    for (size_t k = 0; symmetric && k < first_at.size() && tier < 0; ++k) {
      bool same = true;
      for (size_t q = 0; q < m && same; ++q)
        if (q != p && q != first_at[k])
          same = l.latency(at(p), at(q)) == l.latency(at(first_at[k]), at(q)) &&
                 l.bandwidth(at(p), at(q)) == l.bandwidth(at(first_at[k]), at(q));
      if (same) tier = static_cast<int>(k);
    }
    if (tier < 0) {
      tier = static_cast<int>(first_at.size());
      first_at.push_back(p);
      t.first.push_back(ranks[p]);
      t.second.push_back(-1);
    } else if (t.second[static_cast<size_t>(tier)] < 0) {
      t.second[static_cast<size_t>(tier)] = ranks[p];
    }
    t.tier.push_back(tier);
  }
  return t;
}

void check_same_tiers(const LinkTiers& a, const LinkTiers& b) {
  CHECK(a.tier == b.tier);
  CHECK(a.first == b.first);
  CHECK(a.second == b.second);
}

}  // namespace

TEST_CASE("plan costs: the all-reduce priced per link tier is the pairwise form's, bit for bit") {
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> unit(0, 1);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + trial % 9;
    const ClusterModel c = random_cluster(rng, n, 1 + static_cast<size_t>(trial) % 3);
    const ClusterModel d = dense(c);
    const LinkTiers world = link_tiers(c);
    // A group of some of the ranks, in a shuffled order.
    std::vector<int> group(n);
    std::iota(group.begin(), group.end(), 0);
    std::shuffle(group.begin(), group.end(), rng);
    group.resize(1 + static_cast<size_t>(trial) % n);
    // Parts: by share, one hub, or some owners and some not.
    std::vector<double> parts(group.size());
    for (double& p : parts) p = trial % 3 == 0 ? 1.0 / static_cast<double>(parts.size()) : unit(rng) < 0.5 ? 0 : unit(rng);
    if (trial % 3 == 1) std::fill(parts.begin(), parts.end(), 0), parts[0] = 1;
    CAPTURE(trial);
    const double expected = pairwise_allreduce_seconds(c, group, parts, 4e6);
    CHECK(weighted_allreduce_seconds(c, group, parts, 4e6) == expected);           // the group's own tiers
    CHECK(weighted_allreduce_seconds(c, group, parts, 4e6, &world) == expected);   // the cluster's
    // The dense form (a site per rank) alike, and the tiers of both the pairwise ones.
    CHECK(weighted_allreduce_seconds(d, group, parts, 4e6) == expected);
    CHECK(weighted_allreduce_seconds(d, group, parts, 4e6, &world) == expected);
    std::vector<int> all(n);
    std::iota(all.begin(), all.end(), 0);
    check_same_tiers(world, pairwise_tiers(c, all));
    check_same_tiers(link_tiers(d), world);
    check_same_tiers(link_tiers(c, group), pairwise_tiers(c, group));
    check_same_tiers(link_tiers(d, group), pairwise_tiers(c, group));
    CHECK(device_classes(c) == device_classes(d));
    ++compared;
  }
  CHECK(compared == 300);
}

TEST_CASE("planner: links by site plan as the same links in dense matrices, bit for bit") {
  // Three sites, some ranks throttled: the whole plan (layout, shares, memory, prediction)
  // from each form, compared as its JSON.
  std::mt19937 rng(7);
  int planned = 0;
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    const ClusterModel c = random_cluster(rng, 4 + static_cast<size_t>(trial) % 6, 1 + static_cast<size_t>(trial) % 3);
    const PlannerInput compact = input(c, mlp_costs(c), 256), pairs = input(dense(c), mlp_costs(c), 256);
    CHECK(plan_to_json(make_plan(compact)) == plan_to_json(make_plan(pairs)));
    CHECK(plan_to_json(*local_plan_for(compact, make_plan(compact), config::SyncPolicy::local, 0)) ==
          plan_to_json(*local_plan_for(pairs, make_plan(pairs), config::SyncPolicy::local, 0)));
    ++planned;
  }
  CHECK(planned == 12);
}

TEST_CASE("plan costs: link tiers are the ranks of one site; an asymmetric matrix gets a tier per rank") {
  // Ranks 0-5 on one site, 6-9 on another behind a slower link; rank 3 alone behind its own.
  ClusterModel c = cluster(std::vector<double>(10, 1e12), std::vector<double>(10, 64 * kGiB), 1e-6, 1e10);
  for (size_t i = 0; i < 10; ++i)
    for (size_t j = 0; j < 10; ++j)
      if (i != j && (i >= 6) != (j >= 6)) c.links.set_latency(i, j, 1e-3);
  for (size_t i = 0; i < 10; ++i)
    if (i != 3) set_bandwidth(c, i, 3, 1e8);
  const LinkTiers t = link_tiers(c);
  CHECK(t.tier == std::vector<int>{0, 0, 0, 1, 0, 0, 2, 2, 2, 2});
  CHECK(t.first == std::vector<int>{0, 3, 6});
  CHECK(t.second == std::vector<int>{1, -1, 7});
  // Of some ranks alone, their links to one another only: two ranks are always alike;
  // rank 3 differs from 0 and 1 in its links to them.
  CHECK(link_tiers(c, {3, 6}).tier == std::vector<int>{0, 0});
  CHECK(link_tiers(c, {3, 0, 1}).tier == std::vector<int>{0, 1, 1});
  CHECK(link_tiers(c, {0, 6, 1, 7}).tier == std::vector<int>{0, 1, 0, 1});
  c.links.set_latency(1, 2, 5e-6);  // one way only
  const LinkTiers own = link_tiers(c);
  CHECK(own.tier == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(weighted_allreduce_seconds(c, {0, 1, 2, 6}, {0.25, 0.25, 0.25, 0.25}, 1e6, &own) ==
        pairwise_allreduce_seconds(c, {0, 1, 2, 6}, {0.25, 0.25, 0.25, 0.25}, 1e6));
}

namespace {

// `per` ranks each of four classes, fastest first: A (8 TFLOP/s) and B (4) unthrottled,
// C (2) and D (1) under a CPU quota of 0.2 (each wakes 3.2 ms late to every message,
// plan_costs.h's wake_seconds); every link free. The MLP's size: 2 blocks of 3.3e5
// parameters, 47 us per sample and block at 8 TFLOP/s.
ClusterModel four_classes(size_t per) {
  std::vector<double> flops;
  for (double f : {8e12, 4e12, 2e12, 1e12}) flops.insert(flops.end(), per, f);
  ClusterModel c = cluster(flops, std::vector<double>(4 * per, 64 * kGiB));
  for (size_t r = 0; r < 4 * per; ++r) c.ranks[r].id = c.ranks[r].name = std::string(1, static_cast<char>('A' + r / per));
  for (size_t r = 2 * per; r < 4 * per; ++r) {
    c.ranks[r].cpu_quota = 0.2;
    c.ranks[r].cpu_quota_period_s = 0.01;
  }
  return c;
}

}  // namespace

TEST_CASE("local plan at scale: 4,096 ranks of 4 classes, free links join, throttled ranks step alone") {
  // A and B on free links without a quota: their all-reduce costs nothing, so B's run
  // joins A's group. C and D wake 3.2 ms late to each of the all-reduce's messages, more
  // than a rank's share of the batch takes, so no group with them keeps
  // kGroupEfficiency: each of their ranks steps alone (as rank by rank on 4 ranks, in
  // test_local_plan.cpp's throttled cluster).
  const size_t per = 1024;
  const ClusterModel c = four_classes(per);
  // A batch that gives each A rank 34 samples: the integer split of a group's share
  // then paces it within 3% of the ranks alone (at 2 samples a rank, 4 against 5 did not
  // keep kGroupEfficiency).
  const PlannerInput in = input(c, mlp_costs(c), 65536);
  const Plan p = *local_plan_for(in, make_plan(in), config::SyncPolicy::local, 0);
  check_plan(p);
  REQUIRE(p.local);
  const auto& groups = p.local->groups;
  REQUIRE(groups.size() == 1 + 2 * per);
  CHECK(groups[0].size() == 2 * per);  // the first 2,048 replicas: A's and B's ranks
  for (size_t g = 0; g < groups.size(); ++g) CHECK(group_ranks(p, static_cast<int>(g)).size() == (g == 0 ? 2 * per : 1));
  std::vector<int> first = group_ranks(p, 0);
  std::sort(first.begin(), first.end());
  std::vector<int> ab(2 * per);
  std::iota(ab.begin(), ab.end(), 0);
  CHECK(first == ab);
  for (size_t g = 1; g < groups.size(); ++g) CHECK(group_ranks(p, static_cast<int>(g))[0] == static_cast<int>(2 * per + g - 1));
  for (const RankPlan& r : p.ranks) CHECK(r.replica >= 0);  // none idle
}
