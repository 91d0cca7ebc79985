// Splits a model's blocks into contiguous pipeline stages over devices of unequal speed
// and memory. Stage s runs on devices[s] (the pipeline order is the caller's choice: it
// usually follows the links). The objective is the slowest stage's time per micro-batch,
// because in a full 1F1B pipeline that stage sets the step rate; the constraint is that
// each stage's weight state plus its in-flight activations fit its device.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "plan/cluster_model.h"

namespace ht::plan {

struct StagePartitionInput {
  // [stage][block]: forward + backward seconds per sample of the block on the device of
  // that stage (a probe profile, or FLOPs / rate). One row per entry of `devices`.
  std::vector<std::vector<double>> compute_seconds;
  std::vector<double> memory_bytes;      // [block] parameters + gradients + optimiser state
  std::vector<double> activation_bytes;  // [block] per sample, kept until its backward
  // [block] per sample, alive while it runs (BlockCosts::workspace_bytes); empty: none.
  // A stage holds its largest once, per micro-batch size.
  std::vector<double> workspace_bytes;
  std::vector<DeviceModel> devices;      // pipeline order; memory_bytes is the capacity
  int micro_batch_size = 1;
  int micro_batches = 1;  // M: micro-batches per step; bounds what 1F1B keeps in flight
  // Rank 0 evaluates and checkpoints the whole model, so in a pipeline it also holds the
  // weights of every block outside its stage. With whole_model_stage >= 0 that stage's
  // memory counts them (weight_bytes, per block) against whole_model_capacity (rank 0's
  // memory); its own blocks must still fit devices[stage] (the stage group's smallest).
  // whole_model_streamed: rank 0 keeps them in host memory and streams one block at a
  // time through its device (a GPU rank), so the largest of them counts.
  int whole_model_stage = -1;
  std::vector<double> weight_bytes;
  double whole_model_capacity = 0;
  bool whole_model_streamed = false;
  std::string whole_model_device;  // rank 0's label, named where its memory is the bound
};

struct StagePartition {
  std::vector<std::pair<int, int>> ranges;  // [begin, end) blocks per stage
  double bottleneck_seconds = 0;            // slowest stage's time per micro-batch
  std::vector<double> stage_seconds;        // per micro-batch
  std::vector<double> stage_memory_bytes;   // weight state + in-flight activations
  std::vector<int> unfit_stages;            // stages that do not fit (uniform_partition)
};

// Micro-batches of activations 1F1B keeps on stage `stage` of `stages`: min(S - s, M).
int in_flight_micro_batches(int stage, int stages, int micro_batches);

// The optimal split: contiguous non-empty ranges covering every block, minimising the
// bottleneck subject to memory. Dynamic programming over (stage, first block), O(S*B^2).
// Throws ht::Error on invalid input (sizes, more stages than blocks), and StageSplitError
// (plan_facts.h) when no split fits, naming the block/stage/device that cannot be placed
// and bytes vs capacity.
StagePartition partition_stages(const StagePartitionInput& in);

// The DeepSpeed "uniform" baseline: floor(B/S) blocks per stage, the remainder one each
// to the first stages. Evaluated with the same cost and memory model; stages that do not
// fit are listed in `unfit_stages` instead of thrown (it is a baseline to compare against).
// Invalid input still throws.
StagePartition uniform_partition(const StagePartitionInput& in);

}  // namespace ht::plan
