#include "plan/block_costs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ht::plan {

double optimizer_state_bytes_per_param(const config::OptimizerConfig& opt) {
  if (opt.type == "adamw") return 8;  // first and second moments, fp32
  if (opt.type == "sgd") return opt.momentum != 0.f ? 4 : 0;  // momentum buffer
  fail("block_costs: unknown optimizer type '", opt.type, "'; expected adamw or sgd");
}

double gemm_rate(const DeviceModel& dev, std::string_view precision) {
  if (precision == "bf16" && dev.kind == DeviceKind::cuda && dev.bf16_flops > 0) return dev.bf16_flops;
  return dev.flops;
}

BlockCosts block_costs(const nn::Sequential& model, const ClusterModel& cluster,
                       const config::OptimizerConfig& opt, std::string_view precision) {
  return block_costs(nn::shape_of(model), cluster, opt, precision);
}

double predictions_per_sample(const nn::ModelShape& model) {
  if (model.blocks.empty()) return 1;
  const Shape& logits = model.blocks.back().sample_output_shape;
  return logits.empty() || logits.back() == 0 ? 1
                                              : static_cast<double>(numel(logits)) / static_cast<double>(logits.back());
}

double eval_bytes_per_sample(const nn::ModelShape& model, bool fused_attention) {
  if (model.blocks.empty()) return 0;
  const auto values = static_cast<double>(numel(model.blocks.back().sample_output_shape));
  const double predictions = predictions_per_sample(model);
  // The batch (its inputs, an int32 target a prediction) is held while the blocks run one
  // after another, each beside its input, and then the loss (the logits, a log-sum-exp and
  // a loss a prediction).
  const nn::BlockShape& first = model.blocks.front();
  const double batch = static_cast<double>(numel(first.sample_input_shape) * dtype_size(first.input_dtype)) + predictions * 4;
  double fullest = (values + 2 * predictions) * 4;
  for (size_t b = 0; b < model.blocks.size(); ++b) {
    const nn::BlockShape& blk = model.blocks[b];
    const double input = b > 0 ? static_cast<double>(numel(blk.sample_input_shape)) * 4 : 0;  // f32 within the model
    fullest = std::max(fullest, input + static_cast<double>(fused_attention ? blk.eval_fused_bytes_per_sample
                                                                            : blk.eval_bytes_per_sample));
  }
  return batch + fullest;
}

BlockCosts block_costs(const nn::ModelShape& model, const ClusterModel& cluster,
                       const config::OptimizerConfig& opt, std::string_view precision) {
  const size_t blocks = model.size();
  const size_t ranks = cluster.ranks.size();
  HT_CHECK(cluster.block_seconds.size() <= ranks, "block_costs: the measured profile has ",
           cluster.block_seconds.size(), " rank rows but the cluster has ", ranks,
           " ranks");
  const double opt_bytes = optimizer_state_bytes_per_param(opt);

  BlockCosts c;
  c.optimizer_bytes_per_param = opt_bytes;
  for (size_t b = 0; b < blocks; ++b) {
    const nn::BlockShape& blk = model.blocks[b];
    const auto params = static_cast<double>(blk.params);
    c.flops.push_back(static_cast<double>(blk.flops_per_sample));
    c.params.push_back(params);
    c.state_bytes.push_back(params * (kWeightBytesPerParam + kGradBytesPerParam + opt_bytes));
    c.activation_bytes.push_back(static_cast<double>(blk.activation_bytes_per_sample));
    c.workspace_bytes.push_back(static_cast<double>(blk.workspace_bytes_per_sample));
    c.input_bytes.push_back(static_cast<double>(numel(blk.sample_input_shape) *  // i32 ids too
                                                dtype_size(blk.input_dtype)));
    c.output_bytes.push_back(static_cast<double>(numel(blk.sample_output_shape)) * 4);  // f32
  }

  if (blocks > 0) {
    const auto values = static_cast<double>(numel(model.blocks.back().sample_output_shape));
    c.workspace_bytes.back() += (values + 2 * predictions_per_sample(model)) * 4;  // f32
    c.eval_bytes_per_sample = eval_bytes_per_sample(model, false);
    c.eval_fused_bytes_per_sample = eval_bytes_per_sample(model, true);
  }

  c.seconds_per_sample.resize(ranks);
  c.call_seconds.resize(ranks);
  c.step_seconds.resize(ranks);
  c.source.resize(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    const bool has_profile = r < cluster.block_seconds.size() && !cluster.block_seconds[r].empty();
    if (has_profile) {
      const auto& row = cluster.block_seconds[r];
      HT_CHECK(row.size() == blocks, "block_costs: the measured profile of rank ", r, " has ",
               row.size(), " blocks but the model has ", blocks,
               " blocks; expected a probe that profiled this model");
      for (size_t b = 0; b < blocks; ++b)
        HT_CHECK(std::isfinite(row[b]) && row[b] >= 0, "block_costs: measured seconds of rank ",
                 r, " block ", b, " is ", row[b], "; expected finite and >= 0");
      c.seconds_per_sample[r] = row;
      c.source[r] = kSourceMeasured;
      if (r < cluster.block_step_seconds.size() && cluster.block_step_seconds[r].size() == blocks)
        c.step_seconds[r] = cluster.block_step_seconds[r];
      if (r < cluster.block_call_seconds.size() && cluster.block_call_seconds[r].size() == blocks)
        c.call_seconds[r] = cluster.block_call_seconds[r];
    } else {
      const double rate = gemm_rate(cluster.ranks[r], precision);
      HT_CHECK(std::isfinite(rate) && rate > 0, "block_costs: rank ", r, " (",
               cluster.ranks[r].id, ") has flops ", rate, "; expected positive and finite");
      auto& row = c.seconds_per_sample[r];
      row.resize(blocks);
      for (size_t b = 0; b < blocks; ++b)
        row[b] = kTrainFlopsPerForwardFlop * c.flops[b] / rate;
      c.source[r] = kSourceModelled;
    }
    // Calls the profile did not time get the device's figure (a probed GPU's launches),
    // else the engine's.
    const DeviceModel& dev = cluster.ranks[r];
    c.call_seconds[r].resize(blocks, 0);
    for (double& call : c.call_seconds[r])
      if (call <= 0)
        call = dev.call_seconds > 0 ? dev.call_seconds : dev.kind == DeviceKind::cuda ? kCallSecondsCuda : kCallSecondsCpu;
    // Blocks the profile did not time (older files) get the bandwidth model.
    const double bw = cluster.ranks[r].memory_bandwidth;
    c.step_seconds[r].resize(blocks, 0);
    for (size_t b = 0; b < blocks; ++b)
      if (c.step_seconds[r][b] <= 0 && bw > 0)
        c.step_seconds[r][b] = c.params[b] * (kStepBytesPerParam + 2 * opt_bytes) / bw;
  }
  return c;
}

double replica_samples_per_s(const BlockCosts& costs, int rank) {
  HT_CHECK(rank >= 0 && static_cast<size_t>(rank) < costs.seconds_per_sample.size(),
           "replica_samples_per_s: rank ", rank, " out of range; the costs have ",
           costs.seconds_per_sample.size(), " ranks");
  const auto& row = costs.seconds_per_sample[static_cast<size_t>(rank)];
  const double total = std::accumulate(row.begin(), row.end(), 0.0);
  HT_CHECK(total > 0, "replica_samples_per_s: rank ", rank,
           " has zero total seconds per sample; expected positive");
  return 1.0 / total;
}

}  // namespace ht::plan
