// An ordinary LibTorch model split over a tensor-parallel group: by a
// [tensor_parallel.plan] that rewrites its Linear and Embedding modules in place, or,
// with no plan, as written with this module's parallel layers.
//
// A plan maps module-path globs to styles (config.h, TpStyle):
//
//   [tensor_parallel.plan]
//   "token_embedding" = "vocab_embedding"
//   "position_embedding" = "replicate"
//   "blocks.*.qkv" = { style = "column", parts = 3, heads = 4 }   # fused [q | k | v]
//   "blocks.*.attn_proj" = { style = "row", heads = 4 }
//   "blocks.*.fc" = "column"
//   "blocks.*.mlp_proj" = "row"
//   "head" = "vocab_output"
//
// Applying it slices each matched module's weights to this rank's part (so the parallel
// model computes the dense model's function) and registers the module's weight. LibTorch
// modules have no forward hooks and a parent calls its child's forward directly, so the
// communication is added at the operator dispatcher instead: while a Scope is open on a
// thread, the call through which a Linear or Embedding uses a registered weight runs
// its parallel version (for a column layer: copy_to_region on the input, then the
// local product; for a row layer: the local product, reduce_from_region, then the
// bias). Those calls are aten::linear (LibTorch 2.x's F::linear), aten::addmm and
// aten::matmul on the transposed weight (1.13's F::linear) and aten::embedding; a weight
// is recognised by its storage, offset and size, so views of it and ZeRO's flat buffers
// are followed. Any other operator runs untouched. The fallback is the kTensorParallel
// layer of core/operator_interception.h (below ZeRO's, so both can be open); the
// registered weights belong to the ParallelizedModel, lent to the handler by its Scope.
// A planned model claims the layer when built: UsageError if another library holds it.
//
// With sequence parallelism, activations outside the tensor-parallel regions are split
// along the sequence (TensorParallelOptions::sequence_dim): column layers all-gather
// their input along it, row layers and the vocabulary embedding reduce-scatter their
// output along it, and a replicated Embedding returns its own part of the sequence.
// Every replicated parameter then sees only this rank's part of the sequence, so its
// gradient is partial: the engine sums those gradients over the group
// (partial_gradient_parameters()). This assumes that every replicated Embedding feeds
// the sequence stream (its output's sequence_dim is the sequence), as position
// embeddings do; one indexed per sample would be split along the wrong dimension.
//
// What the model must allow: it reads sizes from tensors, not from its configuration,
// wherever a split changes them (a column layer's output has 1/tp of the features,
// so attention must infer its local head count from its projection's output; with
// sequence parallelism, the sequence length of the residual stream is 1/tp).
//
//   auto split = tensor_parallel::ParallelizedModel(*model, config.tensor_parallel, mesh.tp());
//   { auto scope = split.scope(); loss = loss_fn(model->forward(x)); loss.backward(); }
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/config.h"
#include "parallax/core/tensor_cut.h"

namespace parallax::tensor_parallel {

/// How a plan sees the model it is applied to (per call; defaults fit a whole model).
struct ParallelizeOptions {
  /// The path plan rules match for a module at `path` in the model (e.g. a pipeline
  /// stage's "chunk0.3.qkv" is the whole model's "blocks.2.qkv"). Default: the path itself.
  std::function<std::string(const std::string& path)> plan_path;
  /// The model is one part of a larger one (a pipeline stage): a rule may match nothing
  /// here, and the caller checks rules_matched() across the parts. Default: false.
  bool part_of_model = false;
};

class ParallelizedModel {
 public:
  /// With a plan: matches every Linear and Embedding of `model` to exactly one rule and
  /// slices the matched modules' weights in place (parameters keep their identity, so
  /// optimizers and hooks made later see the parts). Throws ConfigError naming the rule
  /// and module paths when a Linear or Embedding is matched by no rule (listing them) or
  /// by two, a rule matches nothing, a style does not fit the module's type, a split
  /// does not divide (features, parts, heads by tp), two modules share a weight that is
  /// split (tied weights), a split Embedding uses padding_idx, max_norm,
  /// scale_grad_by_freq or sparse gradients, or two vocab_output layers leave their
  /// logits split; every check runs before any weight is sliced. Without a plan: finds
  /// the model's tensor_parallel/ layers, and throws ConfigError when there are none (tp
  /// > 1 would then replicate the whole model) or when sequence parallelism is asked for. `tp` must outlive this object
  /// and the model's use. Does not communicate. Every rank of `tp` must hold the same dense model.
  ParallelizedModel(torch::nn::Module& model,
                    const TensorParallelOptions& options,
                    Communicator& tp,
                    const ParallelizeOptions& how = {});
  ParallelizedModel(ParallelizedModel&&) noexcept;
  ParallelizedModel& operator=(ParallelizedModel&&) noexcept;
  /// Unregisters the planned weights: their modules then compute their local part only.
  ~ParallelizedModel();

  /// While alive, this model's planned modules' operators on this thread (and in the
  /// work LibTorch carries its state to: autograd's device threads, at::launch) run
  /// their parallel versions, as do those of enclosing scopes' models. Open it around
  /// forward; backward needs none (the parallel versions' own autograd functions
  /// communicate). Nesting is allowed; a default-constructed Scope does nothing.
  class Scope {
   public:
    Scope();
    Scope(Scope&&) noexcept;
    Scope& operator=(Scope&&) = delete;
    ~Scope();

   private:
    friend class ParallelizedModel;
    struct Open;
    explicit Scope(std::unique_ptr<Open> open);
    std::unique_ptr<Open> open_;
  };
  Scope scope() const;

  /// How many ranks of the group hold the same elements of `parameter`: 1 when it is
  /// split (each rank holds other elements), tp when every rank holds all of it, and in
  /// between for grouped-query attention's replicated key/value heads. A global norm
  /// sums ‖g‖² / copies over the group.
  std::int64_t copies(const torch::Tensor& parameter) const;
  /// This rank's part of `whole`, a tensor of the dense model's shape for `parameter`
  /// (its weights from a checkpoint saved under tp = 1 or a weights file, or optimizer
  /// state of that shape), cut as the plan cut `parameter`. Throws UsageError for a
  /// parameter no plan rule split, or a `whole` of another shape.
  torch::Tensor part_of(const torch::Tensor& parameter, const torch::Tensor& whole) const;
  /// How a plan rule cut `parameter` from its dense tensor: this rank's part `index` of
  /// `count`, cut as `cut` from a tensor of `whole_shape` (what a checkpoint records to
  /// join the parts under another tp). Nothing for a parameter no rule split.
  struct Split {
    TensorCut cut;
    std::vector<std::int64_t> whole_shape;
    std::int64_t index = 0;
    std::int64_t count = 1;
  };
  std::optional<Split> split_of(const torch::Tensor& parameter) const;
  /// The replicated parameters whose gradients are partial sums over the group (with
  /// sequence parallelism: every replicated one; otherwise none).
  std::vector<torch::Tensor> partial_gradient_parameters() const;
  /// The vocabulary of a `vocab_output` layer whose logits stay split (then the loss
  /// must be vocab_parallel_cross_entropy); 0 when the model's output is whole.
  std::int64_t split_output_vocabulary() const;
  /// For each rule of the plan, in order: whether it matched a module of this model.
  std::vector<bool> rules_matched() const;
  /// One line per rule (or layer kind): what it matched and how it was split.
  std::vector<std::string> describe() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace parallax::tensor_parallel
