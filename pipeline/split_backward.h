// zb-h1's backward in two passes (internal to pipeline/; used by the executor).
//
// Protocol for one micro-batch's chunk:
//  a. Input pass (constructor): hook every node of the graph (from the roots down to the
//     leaves) to record the gradient it receives, then run torch::autograd::grad(roots,
//     inputs, retain_graph) for the chunk's inputs only. The engine runs just the nodes
//     on paths to the inputs, and a node computes only the outputs some path needs, so
//     no weight gradient is computed (a Linear's MmBackward computes the input's
//     gradient, not the weight's).
//  b. The boundary: nodes that ran and have an edge into a parameter's accumulator or
//     into a node that did not run (which can lead only to parameters: everything on a
//     path to an input ran). Every path from the roots to a parameter leaves the part
//     that ran at exactly one boundary node, and that node's recorded gradient already
//     sums every way the roots reach it. Roots the input pass never reached count as
//     boundary too, with their own gradient.
//  c. Weight pass (weight_pass()): each boundary node loses its edges that do not lead
//     into the weights, and the autograd engine runs from the boundary with the recorded
//     gradients, accumulating into the parameters' .grad (gradient-accumulator hooks
//     fire as usual). Each node computes only what its remaining edges need.
// With no input that needs a gradient (the model's first part), the input pass does
// nothing and the weight pass is one whole backward.
// Exactness: each parameter gets the sum over every path of the same products a whole
// backward forms; only the order of accumulation across micro-batches is the schedule's.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include <memory>
#include <unordered_set>
#include <vector>

namespace parallax::pipeline::detail {

class SplitBackward {
 public:
  /// The input pass. `roots` with `grads` (empty grads: the roots are scalars seeded
  /// with 1) are what the backward starts from; `inputs` the chunk's inputs (those that
  /// do not require grad get an undefined gradient); `params` the chunk's trainable
  /// parameters. Fills `input_grads` (one per input). Keeps the graph for weight_pass().
  SplitBackward(std::vector<torch::Tensor> roots,
                std::vector<torch::Tensor> grads,
                const std::vector<torch::Tensor>& inputs,
                const std::vector<torch::Tensor>& params,
                std::vector<torch::Tensor>& input_grads);
  SplitBackward(SplitBackward&&) noexcept;
  SplitBackward& operator=(SplitBackward&&) noexcept;
  ~SplitBackward();

  /// The weight pass: accumulates the parameters' gradients and frees the graph. Once.
  void weight_pass();

  /// Boundary nodes the weight pass starts from (0 before the input pass ran or after the
  /// weight pass).
  std::size_t boundary_nodes() const { return users_.size() + unreached_roots_.size(); }

 private:
  struct User {
    std::shared_ptr<torch::autograd::Node> node;
    torch::autograd::variable_list recorded;
  };
  static bool is_accumulator(const torch::autograd::Edge& edge);
  static const void* accumulated_variable(const torch::autograd::Edge& edge);  // an accumulator's TensorImpl
  bool into_weights(const torch::autograd::Edge& edge) const;

  std::vector<torch::Tensor> roots_;  // keep the graph alive until the weight pass
  std::vector<torch::Tensor> grads_;
  bool whole_backward_ = false;
  std::unordered_set<const void*> params_;                // TensorImpl of the chunk's parameters
  std::unordered_set<const torch::autograd::Node*> ran_;  // nodes the input pass ran
  std::vector<User> users_;                               // the boundary nodes that ran
  std::vector<torch::Tensor> unreached_roots_;
  std::vector<torch::Tensor> unreached_grads_;
};

}  // namespace parallax::pipeline::detail
