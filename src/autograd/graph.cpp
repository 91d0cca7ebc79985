#include "autograd/graph.h"

#include <unordered_map>

#include "core/error.h"

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

// The sweep adds gradients with the backend's primitive rather than ops' add (ops stand
// above autograd); both sides always have the shape of the output they belong to.
void check_addable(const Tensor& into, const Tensor& g) {
  HT_CHECK(into.shape() == g.shape() && into.dtype() == g.dtype(),
           "backward(): cannot add a gradient of shape ", to_string(g.shape()), " to one of shape ",
           to_string(into.shape()), "; expected the shape of the output they belong to");
}

Tensor sum_of(const Tensor& a, const Tensor& b) {
  check_addable(a, b);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.backend(), "gradient");
  a.backend().binary(BinaryOp::add, a.data(), a.strides(), b.data(), b.strides(), out.data(), a.shape());
  return out;
}

void accumulate_into_leaf(TensorImpl& leaf, Tensor g) {
  if (leaf.grad) {
    Tensor acc(leaf.grad);
    check_addable(acc, g);
    HT_CHECK(acc.is_contiguous(), "backward(): the leaf's gradient of shape ", to_string(acc.shape()),
             " is a strided view; expected a dense tensor to accumulate into");
    acc.backend().binary(BinaryOp::add, acc.data(), acc.strides(), g.data(), g.strides(), acc.data(),
                         acc.shape());
    return;
  }
  // Adopt the buffer when nothing else can see it; otherwise copy, because the same
  // gradient may also flow to another input (add returns it to both sides).
  bool exclusive = g.impl_ptr().use_count() == 1 && g.impl()->storage.use_count() == 1 &&
                   g.is_contiguous() && g.offset() == 0;
  leaf.grad = exclusive ? g.impl_ptr() : g.dense_copy().impl_ptr();
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
      if (!fresh) slot->second = sum_of(slot->second, in_grads[i]);
    }
  }
}

Tensor& Tensor::set_requires_grad(bool on) {
  HT_CHECK(!on || dtype() == DType::f32, "set_requires_grad: an ", dtype_name(dtype()),
           " tensor cannot have a gradient; expected float32");
  HT_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can be marked; this one was made by ",
           impl_->grad_fn->name, " (use detach() first)");
  impl_->requires_grad = on;
  return *this;
}

void Tensor::backward() const {
  HT_CHECK(numel() == 1, "backward(): called on a tensor of shape ", to_string(shape()),
           "; expected a single element (pass a gradient for other shapes)");
  run_backward(*this, Tensor::full(shape(), 1.f, backend()));
}

void Tensor::backward(const Tensor& grad_output) const { run_backward(*this, grad_output); }

}  // namespace ht
