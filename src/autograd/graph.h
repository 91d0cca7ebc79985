// The autograd graph: each op output that needs a gradient points at a Node holding
// the op's backward closure and one edge per input. Edges lead to the inputs' own
// Nodes, or to an accumulator Node for leaves, never to the inputs' data: an op keeps
// an input alive only by capturing it in its closure, which it does only when its
// backward needs the values.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace ht {

struct Node {
  // Receives the gradient of the op's output and returns one gradient per input
  // (undefined where needs(i) is false).
  using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out, const Node& self)>;

  const char* name = "";
  std::vector<std::shared_ptr<Node>> next;  // per input; null when that input needs no grad
  BackwardFn backward;
  std::weak_ptr<TensorImpl> leaf;           // set on leaf accumulators only

  bool needs(size_t input) const { return input < next.size() && next[input] != nullptr; }
};

// Gradient recording is on by default; a NoGradGuard switches it off for its scope
// (optimiser steps, evaluation, the backward sweep itself).
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when recording is on and any input requires a gradient.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);

// Makes `out` the result of a recorded op. Call only when any_requires_grad(inputs).
void record(Tensor& out, const char* name, const std::vector<const Tensor*>& inputs,
            Node::BackwardFn backward);

// Reverse sweep from `root` seeded with `grad_root`; accumulates into leaves' grad().
// Frees each node's closure once used, so the graph can be run backward once.
void run_backward(const Tensor& root, const Tensor& grad_root);

}  // namespace ht
