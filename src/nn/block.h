// A Block is the planner's unit of partitioning: a model is a sequence of Blocks, and
// pipeline stages take contiguous ranges of them. Besides computing, each Block states
// what the planner needs to place it: parameters, forward FLOPs per sample, the
// activation bytes per sample its backward keeps alive, and the shape it hands on.
// Each Block type computes those figures in a static describe(hyper-parameters)
// (nn/block_shape.h) that its methods return, so the planner can describe a model from
// its config without building it and get the same figures.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace ht::nn {

class Block : public Module {
 public:
  // x is batched: (batch, sample_input_shape...). Returns (batch, sample_output_shape...).
  virtual Tensor forward(const Tensor& x) = 0;

  // A short name of the block's type for plans and reports ("conv_relu_pool", ...).
  virtual std::string kind() const = 0;

  // Forward FLOPs for one sample. Convention (used by every block and by the tests'
  // hand counts): a multiply-add is 2 FLOPs; each elementwise operation on one value
  // (bias add, activation, comparison in pooling, normalisation step) is 1 FLOP per
  // the count documented at each block's implementation.
  virtual int64_t flops_per_sample() const = 0;

  // Bytes of activations that the backward pass keeps alive for one sample, as the
  // ops used by forward() actually save them.
  virtual int64_t activation_bytes_per_sample() const = 0;

  // Bytes per sample alive at once beyond those, at the block's fullest moment of a
  // training step (forward or backward): the gradients in flight through its ops and
  // the outputs its ops make and do not keep (nn/cost_model.h).
  virtual int64_t workspace_bytes_per_sample() const = 0;

  // Bytes per sample a forward without gradients (an evaluation) holds at its fullest
  // moment beyond the block's input: its output and the op outputs alive beside it
  // (nn/cost_model.h).
  virtual int64_t eval_bytes_per_sample() const = 0;
  // The same where attention is one fused kernel that stores no T x T scores (a GPU's).
  virtual int64_t eval_fused_bytes_per_sample() const { return eval_bytes_per_sample(); }

  // Per-sample shapes (without the batch dimension) and input dtype.
  virtual Shape sample_input_shape() const = 0;
  virtual Shape sample_output_shape() const = 0;
  virtual DType input_dtype() const { return DType::f32; }

  // Position in the block's random stream (dropout masks). Checkpoints save it, so a
  // resumed run draws the masks an uninterrupted run would. 0 for blocks without one.
  virtual uint64_t random_offset() const { return 0; }
  virtual void set_random_offset(uint64_t) {}
};

// A model: Blocks applied in order.
class Sequential : public Module {
 public:
  // While one lives on this thread, add() releases the parameters (Tensor::release) of
  // every block whose index `keep` refuses, as soon as the block is made: a model is
  // built whole from one seed on every rank, so that all agree, and a rank that computes
  // only one pipeline stage then holds the other blocks' weights one at a time, not all
  // at once (runtime/trainer.cpp).
  class KeepOnly {
   public:
    explicit KeepOnly(std::function<bool(size_t)> keep);
    ~KeepOnly();
    KeepOnly(const KeepOnly&) = delete;
    KeepOnly& operator=(const KeepOnly&) = delete;

   private:
    std::function<bool(size_t)> keep_;
    const std::function<bool(size_t)>* outer_;
  };

  void add(std::unique_ptr<Block> block);
  Tensor forward(const Tensor& x) const;  // all blocks
  // Blocks [begin, end): what one pipeline stage runs.
  Tensor forward_range(const Tensor& x, size_t begin, size_t end) const;

  const std::vector<std::unique_ptr<Block>>& blocks() const { return blocks_; }
  size_t size() const { return blocks_.size(); }
  Block& block(size_t i) const { return *blocks_[i]; }

  std::vector<NamedTensor> named_parameters() const override;  // "blocks.<i>.<name>"
  // Those of blocks [begin, end), named the same way: one pipeline stage's.
  std::vector<NamedTensor> named_parameters(size_t begin, size_t end) const;
  void set_training(bool on) override;

  // Weights kept off the device the forward runs on (rank 0 holds the other stages'
  // weights in host memory, so that a model larger than its device can be evaluated and
  // checkpointed): while set, forward and forward_range run each block whose parameters
  // live on another backend with a copy of them on `device`, made just before its forward
  // and dropped just after, the parameters' own storage untouched. Without autograd only:
  // a graph would hold the copies. nullptr (the default) turns it off.
  void stream_weights_to(Backend* device) { stream_to_ = device; }
  Backend* streams_weights_to() const { return stream_to_; }

 private:
  Tensor forward_streamed(size_t block, const Tensor& h) const;

  std::vector<std::unique_ptr<Block>> blocks_;
  Backend* stream_to_ = nullptr;
};

}  // namespace ht::nn
