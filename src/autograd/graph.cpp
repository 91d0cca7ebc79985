#include "autograd/graph.h"

#include <unordered_map>

#include "core/error.h"
#include "ops/ops.h"

namespace ht {

namespace {
thread_local bool t_grad_enabled = true;

std::shared_ptr<Node> grad_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return impl->grad_fn;
  if (!impl->grad_acc) {
    impl->grad_acc = std::make_shared<Node>();
    impl->grad_acc->name = "accumulate_grad";
    impl->grad_acc->leaf = t.impl_ptr();
  }
  return impl->grad_acc;
}

void accumulate_into_leaf(TensorImpl& leaf, Tensor g) {
  if (leaf.grad) {
    Tensor acc(leaf.grad);
    add_(acc, g);
    return;
  }
  // Adopt the buffer when nothing else can see it; otherwise copy, because the same
  // gradient may also flow to another input (add returns it to both sides).
  bool exclusive = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 &&
                   g.is_contiguous() && g.offset() == 0;
  leaf.grad = exclusive ? g.impl_ptr() : clone(g).impl_ptr();
}
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

void record(Tensor& out, const char* name, const std::vector<const Tensor*>& inputs,
            Node::BackwardFn backward) {
  auto node = std::make_shared<Node>();
  node->name = name;
  node->next.reserve(inputs.size());
  for (const Tensor* t : inputs) node->next.push_back(grad_edge(*t));
  node->backward = std::move(backward);
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = std::move(node);
}

void run_backward(const Tensor& root, const Tensor& grad_root) {
  HT_CHECK(root.requires_grad(), "backward(): the tensor of shape ", to_string(root.shape()),
           " does not require a gradient; expected a result of ops on tensors marked with "
           "set_requires_grad()");
  HT_CHECK(grad_root.shape() == root.shape(), "backward(): gradient shape ",
           to_string(grad_root.shape()), " does not match output shape ",
           to_string(root.shape()));
  NoGradGuard no_grad;
  std::shared_ptr<Node> start = grad_edge(root);

  // Topological order by iterative depth-first search (post-order), then reversed.
  std::vector<Node*> order;
  std::unordered_map<Node*, int> state;  // 1 = on stack, 2 = done
  std::vector<std::pair<Node*, size_t>> stack{{start.get(), 0}};
  state[start.get()] = 1;
  while (!stack.empty()) {
    auto& [node, i] = stack.back();
    if (i < node->next.size()) {
      Node* child = node->next[i++].get();
      if (child && !state.count(child)) {
        state[child] = 1;
        stack.push_back({child, 0});
      }
      continue;
    }
    state[node] = 2;
    order.push_back(node);
    stack.pop_back();
  }

  std::unordered_map<Node*, Tensor> grads;
  grads[start.get()] = grad_root;
  for (size_t idx = order.size(); idx-- > 0;) {
    Node* node = order[idx];
    auto it = grads.find(node);
    if (it == grads.end()) continue;  // no gradient flowed here
    Tensor g = std::move(it->second);
    grads.erase(it);
    if (auto leaf = node->leaf.lock()) {
      accumulate_into_leaf(*leaf, std::move(g));
      continue;
    }
    HT_CHECK(node->backward, "backward(): the graph through ", node->name,
             " was already run backward once; expected a fresh forward pass");
    std::vector<Tensor> in_grads = node->backward(g, *node);
    node->backward = nullptr;  // frees what the op saved for backward
    for (size_t i = 0; i < node->next.size(); ++i) {
      Node* child = node->next[i].get();
      if (!child || i >= in_grads.size() || !in_grads[i].defined()) continue;
      auto [slot, fresh] = grads.try_emplace(child, in_grads[i]);
      if (!fresh) slot->second = add(slot->second, in_grads[i]);
    }
  }
}

}  // namespace ht
