// Hand-built clusters, block costs and planner inputs for the planner's unit tests.
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "plan/plan_json.h"
#include "plan/planner.h"

namespace ht::plan::fixtures {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// n ranks with the given FLOP/s and memory, every link `latency` and `bandwidth`.
inline ClusterModel cluster(const std::vector<double>& flops, const std::vector<double>& memory,
                     double latency = 0, double bandwidth = 1e18) {
  ClusterModel c;
  const size_t n = flops.size();
  for (size_t i = 0; i < n; ++i) {
    DeviceModel d;
    d.id = "dev" + std::to_string(i);
    d.name = d.id;
    d.kind = DeviceKind::cpu;
    d.flops = flops[i];
    d.memory_bytes = memory[i];
    c.ranks.push_back(d);  // memory_bandwidth 0: optimiser steps and loads cost nothing
  }
  c.links = Links::uniform(n, latency, bandwidth);
  c.source = "hand-built";
  return c;
}

// The link between ranks i and j (i != j), both ways.
inline void set_latency(ClusterModel& c, size_t i, size_t j, double latency) {
  c.links.set_latency(i, j, latency);
  c.links.set_latency(j, i, latency);
}
inline void set_bandwidth(ClusterModel& c, size_t i, size_t j, double bandwidth) {
  c.links.set_bandwidth(i, j, bandwidth);
  c.links.set_bandwidth(j, i, bandwidth);
}

// `blocks` identical blocks: 1e6 params, 1e9 FLOPs, 1 MB of activations and 64 KB in and
// out per sample (or as given); AdamW state (8 bytes per parameter).
inline BlockCosts costs(const ClusterModel& c, int blocks, double activation = 1e6,
                 double boundary = 65536) {
  BlockCosts k;
  k.optimizer_bytes_per_param = 8;
  for (int b = 0; b < blocks; ++b) {
    k.flops.push_back(1e9);
    k.params.push_back(1e6);
    k.state_bytes.push_back(1e6 * 16);
    k.activation_bytes.push_back(activation);
    k.input_bytes.push_back(boundary);
    k.output_bytes.push_back(boundary);
  }
  for (const DeviceModel& d : c.ranks) {
    k.seconds_per_sample.emplace_back(static_cast<size_t>(blocks), 3e9 / d.flops);
    k.call_seconds.emplace_back(static_cast<size_t>(blocks), kCallSecondsCpu);
    k.step_seconds.emplace_back(static_cast<size_t>(blocks), 0.0);
    k.source.emplace_back(kSourceModelled);
  }
  return k;
}

// The Fashion-MNIST MLP's size: 2 blocks of 3.3e5 parameters, 47 us per sample each on
// a rank of 8 TFLOP/s (its 64 samples take 6 ms, as the MLP's do at quota 0.8), slower
// in proportion to flops.
inline BlockCosts mlp_costs(const ClusterModel& c) {
  BlockCosts k = costs(c, 2);
  for (size_t b = 0; b < 2; ++b) {
    k.params[b] = 3.3e5;
    k.state_bytes[b] = 3.3e5 * 16;
  }
  for (size_t r = 0; r < c.ranks.size(); ++r)
    for (double& s : k.seconds_per_sample[r]) s = 47e-6 * 8e12 / c.ranks[r].flops;
  return k;
}

inline PlannerInput input(const ClusterModel& c, const BlockCosts& k, int64_t batch,
                   const std::string& strategy = "auto") {
  PlannerInput in;
  in.cluster = c;
  in.costs = k;
  in.global_batch = batch;
  in.strategy = config::parse_parallel_strategy(strategy).value();
  in.config_name = "test";
  in.config_hash = "0badc0de";
  return in;
}

// Every rank within its memory; the plan consistent; the planner's activation figure the
// simulator's peak.
inline void check_fits_and_agrees(const Plan& p, const PlannerInput& in) {
  check_plan(p);
  const SimResult sim = simulate_plan(p, in.costs, in.cluster);
  CHECK(sim.step_seconds == doctest::Approx(p.predicted.step_seconds));
  for (const RankPlan& r : p.ranks) {
    CAPTURE(r.rank);
    CHECK(r.memory.total() <= r.device.memory_bytes);
    CHECK(static_cast<double>(sim.peak_activation_bytes[static_cast<size_t>(r.rank)]) ==
          doctest::Approx(r.memory.activations).epsilon(1e-6));
  }
}

}  // namespace ht::plan::fixtures
