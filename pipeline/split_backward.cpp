#include "parallax/pipeline/split_backward.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <unordered_set>

namespace parallax::pipeline::detail {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Records the gradient a node receives, and passes it on unchanged.
class Record final : public torch::autograd::FunctionPreHook {
 public:
  explicit Record(variable_list* into) : into_(into) {}
  variable_list operator()(const variable_list& grads) override {
    *into_ = grads;
    return grads;
  }

 private:
  variable_list* into_;
};

}  // namespace

bool SplitBackward::is_accumulator(const Edge& edge) {
  return dynamic_cast<torch::autograd::AccumulateGrad*>(edge.function.get()) != nullptr;
}

const void* SplitBackward::accumulated_variable(const Edge& edge) {
  return static_cast<torch::autograd::AccumulateGrad*>(edge.function.get())->variable.unsafeGetTensorImpl();
}

SplitBackward::SplitBackward(std::vector<torch::Tensor> roots,
                             std::vector<torch::Tensor> grads,
                             const std::vector<torch::Tensor>& inputs,
                             const std::vector<torch::Tensor>& params,
                             std::vector<torch::Tensor>& input_grads)
    : roots_(std::move(roots)), grads_(std::move(grads)) {
  std::vector<torch::Tensor> wanted;
  for (const torch::Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) wanted.push_back(t);
  }
  input_grads.assign(inputs.size(), torch::Tensor());
  if (wanted.empty() || roots_.empty()) {
    whole_backward_ = true;
    return;
  }
  for (const torch::Tensor& p : params) params_.insert(p.unsafeGetTensorImpl());
  // a. Every node of the graph, each with a hook that records what it receives.
  std::vector<std::shared_ptr<Node>> nodes;
  std::unordered_set<Node*> seen;
  for (const torch::Tensor& root : roots_) {
    if (root.grad_fn() && seen.insert(root.grad_fn().get()).second) nodes.push_back(root.grad_fn());
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    for (const Edge& edge : nodes[i]->next_edges()) {
      if (!edge.is_valid() || is_accumulator(edge)) continue;
      if (seen.insert(edge.function.get()).second) nodes.push_back(edge.function);
    }
  }
  std::vector<variable_list> received(nodes.size());
  std::vector<Record*> hooks;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    auto hook = std::make_unique<Record>(&received[i]);
    hooks.push_back(hook.get());
    nodes[i]->add_pre_hook(std::move(hook));
  }
  auto remove_hooks = [&] {
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      auto& pre = nodes[i]->pre_hooks();
      pre.erase(std::remove_if(pre.begin(), pre.end(), [&](const auto& h) { return h.get() == hooks[i]; }), pre.end());
    }
  };
  std::vector<torch::Tensor> computed;
  try {
    computed = torch::autograd::grad(roots_, wanted, grads_, /*retain_graph=*/true, /*create_graph=*/false,
                                     /*allow_unused=*/true);
  } catch (...) {
    remove_hooks();
    throw;
  }
  remove_hooks();
  std::size_t next = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) input_grads[i] = computed[next++];
  }
  // b. The boundary: nodes the input pass ran that lead into a parameter directly or
  // into a node it did not run (which can lead only to parameters: anything on a path to
  // an input ran). Each path from the roots to a parameter leaves the ran part at
  // exactly one such node, whose recorded gradient carries it.
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (!received[i].empty()) ran_.insert(nodes[i].get());
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (received[i].empty()) continue;
    const bool leads_to_weights = std::any_of(nodes[i]->next_edges().begin(), nodes[i]->next_edges().end(),
                                              [&](const Edge& edge) { return into_weights(edge); });
    if (leads_to_weights) users_.push_back({nodes[i], std::move(received[i])});
  }
  // A root the input pass never reached (no path to an input) starts its own paths.
  for (std::size_t i = 0; i < roots_.size(); ++i) {
    if (roots_[i].grad_fn() && !ran_.count(roots_[i].grad_fn().get())) {
      unreached_roots_.push_back(roots_[i]);
      unreached_grads_.push_back(grads_.empty() ? torch::ones_like(roots_[i]) : grads_[i]);
    }
  }
}

SplitBackward::SplitBackward(SplitBackward&&) noexcept = default;
SplitBackward& SplitBackward::operator=(SplitBackward&&) noexcept = default;
SplitBackward::~SplitBackward() = default;

bool SplitBackward::into_weights(const Edge& edge) const {
  if (!edge.is_valid()) return false;
  if (is_accumulator(edge)) return params_.count(accumulated_variable(edge)) > 0;
  return !ran_.count(edge.function.get());
}

void SplitBackward::weight_pass() {
  if (whole_backward_) {
    if (!roots_.empty()) torch::autograd::backward(roots_, grads_);
    roots_.clear();
    grads_.clear();
    return;
  }
  torch::autograd::edge_list edges;
  variable_list seeds;
  for (User& user : users_) {
    // The input pass already propagated along the other edges: keep only those into the
    // weights, so the node computes only the gradients they need.
    for (Edge& edge : user.node->next_edges()) {
      if (!into_weights(edge)) edge = Edge();
    }
    for (std::size_t input = 0; input < user.recorded.size(); ++input) {
      if (!user.recorded[input].defined()) continue;
      edges.emplace_back(user.node, static_cast<std::uint32_t>(input));
      seeds.push_back(user.recorded[input]);
    }
  }
  for (std::size_t i = 0; i < unreached_roots_.size(); ++i) {
    edges.push_back(torch::autograd::impl::gradient_edge(unreached_roots_[i]));
    seeds.push_back(unreached_grads_[i]);
  }
  if (!edges.empty()) {
    torch::autograd::Engine::get_default_engine().execute(edges, seeds, /*keep_graph=*/false,
                                                          /*create_graph=*/false, /*accumulate_grad=*/true);
  }
  users_.clear();
  ran_.clear();
  unreached_roots_.clear();
  unreached_grads_.clear();
  roots_.clear();
  grads_.clear();
}

}  // namespace parallax::pipeline::detail
