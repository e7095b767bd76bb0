// The pipeline engine: a model given as layer specs, trained over parallel.pp stages
// (× parallel.dp replicas of the whole pipeline) with the [pipeline] schedule.
//
//   auto specs = gpt::layer_specs(options);              // embeddings, blocks..., head
//   parallax::PipelineEngine engine(rt, specs, loss, parallax::OptimizerSpec::from(rt.config()));
//   for (int64_t step = 0; step < steps; ++step) {
//     double loss = engine.train_batch([&] { return next_micro_batch(); });   // every rank
//   }
//
// Construction (collective over the mesh), in order:
//  1. Partition: the layers are cut into pp × virtual_stages contiguous parts by
//     pipeline.partition (uniform, parameters, profile — measured on every rank and
//     averaged — or explicit boundaries); rank 0 logs the cut. Part q runs on stage
//     q mod pp (pipeline/schedule.h).
//  2. Each rank builds only its stage's layers (pipeline/layers.h: layer i is seeded
//     from (train.seed, i), so it starts as it would in a single-process model).
//  3. Tied weights: every holder's copy receives its first holder's value (send/recv
//     over the pipeline group).
//  4. A StepApplier (step_applier.h) takes the stage's module, as Engine's does: the
//     tensor-parallel split, the broadcast over the data-parallel group, its gradient
//     reduction (buckets or ZeRO), optimizer, precision. The clipping norm is summed
//     over the pipeline group, each tied weight counted once.
// train_batch runs this stage's instruction list (pipeline/executor.h): micro-batch
// forwards and backwards with point-to-point transfers, then the data-parallel gradient
// reduction, the tied-weight gradient sum (first holder gathers, sums in stage order and
// sends the total back, so every copy gets identical bits), the loss broadcast from the
// last stage, and the optimizer step.
//
// Tensor parallelism inside the stages (parallel.tp > 1): the [tensor_parallel.plan]
// splits each stage's layers, its rules matched against the whole model's module paths
// (LayerSpec::model_path: "blocks.3.qkv", not the stage's "chunk0.4.qkv"); a rule must
// match on some stage. Each tensor-parallel rank exchanges activations with the same
// tensor-parallel rank of the neighbouring stages (with sequence parallelism, its part of
// the sequence); the last stage's loss function gets whole logits (a vocab_output rule
// gathers them) unless the engine computes the loss itself (CrossEntropyLoss, which is
// vocabulary-parallel on split logits). The clipping norm sums over the tensor-parallel
// and pipeline groups.
//
// ZeRO inside the stages (zero.stage > 0, with [offload]): the stage's parameters are
// sharded over its data-parallel group; every backward instruction runs through the
// GradientReduction (gradient_reduction.h), so stage 1 reduce-scatters once, during the
// last backward that writes weight gradients, and stages 2–3 after every such backward
// (only the buckets that backward reached: with interleaving, its chunk's);
// stage 3 gathers a unit on use in each micro-batch's forward and backward. A tied
// weight's copies are summed whole (each rank's part of the reduced gradient assembled
// over dp, summed over the holders, each rank keeping its part).
//
// Context parallelism inside the stages (parallel.cp > 1): the first and last stages cut
// each micro-batch's inputs and targets by the sequence split (`next()` returns the
// data-parallel rank's whole sequences), activations of a rank's positions travel to the
// same cp rank of the neighbouring stages, and each chunk's forward (and its recompute)
// runs with the context-parallel handle current.
//
// Supported: every cell of tp × cp × pp × dp × ZeRO 0–3 × offload, every schedule,
// recompute, fp32/bf16/fp16 (strategy_matrix.h says why any other is refused).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/pipeline/executor.h"
#include "parallax/pipeline/layers.h"
#include "parallax/runtime/engine.h"

namespace parallax {

struct PipelineEngineOptions {
  /// pipeline.partition = "profile": the micro-batch each layer is timed on (inputs and
  /// targets, as train_batch gets them). Required for "profile", unused otherwise.
  std::optional<pipeline::MicroBatch> profile_batch;
};

/// The last stage's loss for a language model, passed where a LossFunction goes: the
/// mean cross-entropy (fp32) of the last layer's output[0] (logits [..., V]) against
/// targets[0] (int64), computed vocabulary-parallel when a vocab_output rule leaves the
/// logits split over the tensor-parallel group (Engine::cross_entropy), so they are
/// never gathered.
struct CrossEntropyLoss {};

/// Where each layer runs: part boundaries, and the stage and chunk of each part.
struct PipelineLayout {
  std::vector<std::int64_t> boundaries;  ///< [0, ..., layers], pp × virtual_stages parts
  std::string partition;                 ///< how it was chosen, e.g. "parameters"
  std::vector<double> layer_weights;     ///< what was balanced (parameters, ms); empty for uniform/boundaries
};

class PipelineEngine {
 public:
  /// Collective; see the construction protocol above. Throws ConfigError for a config
  /// the model cannot run (more stages or parts than layers, explicit boundaries that do
  /// not end at the layer count, profile without a sample), UsageError for a spec
  /// without factory or a tied path a layer lacks, CommError if a transfer fails.
  /// A LossFunction gets whole logits: a [tensor_parallel.plan] whose vocab_output rule
  /// leaves them split is a ConfigError (on every rank) that names the rule.
  PipelineEngine(Runtime& runtime,
                 std::vector<pipeline::LayerSpec> specs,
                 pipeline::LossFunction loss,
                 const OptimizerSpec& spec,
                 const PipelineEngineOptions& options = {});
  /// With the built-in language-model loss, split logits are fine.
  PipelineEngine(Runtime& runtime,
                 std::vector<pipeline::LayerSpec> specs,
                 CrossEntropyLoss loss,
                 const OptimizerSpec& spec,
                 const PipelineEngineOptions& options = {});
  PipelineEngine(PipelineEngine&&) noexcept;
  ~PipelineEngine();

  /// One optimizer step over train.grad_accum micro-batches: `next()` is called that many
  /// times on the first and last stages (the first reads inputs, the last targets; other
  /// stages do not call it). Returns the step's loss, the mean over the global batch, on
  /// every rank. Blocks; throws CommError when a transfer or collective fails or times out.
  double train_batch(const std::function<pipeline::MicroBatch()>& next);

  /// Checkpoints, as Engine's (engine.h): each stage's ranks write the state they own
  /// under the whole model's parameter names; with checkpoint.every, train_batch saves.
  checkpoint::SaveResult save_checkpoint(const std::string& trainer_state = "");
  std::optional<checkpoint::SaveResult> wait_for_checkpoint();
  std::optional<std::string> resume();
  std::string load_checkpoint(const std::string& directory);
  bool preempted() const;
  void finish();

  /// This rank's pipeline stage (mesh().coord().pp).
  int stage() const;
  const PipelineLayout& layout() const;
  /// This stage's chunks: chunk c holds part c × pp + stage.
  const std::vector<pipeline::LayerSequence>& chunks() const;
  /// This stage's instruction list.
  const std::vector<pipeline::Instruction>& instructions() const;
  /// The schedule as an ASCII timeline under unit costs (pipeline::format_timeline).
  std::string timeline() const;

  /// As Engine's (engine.h), for this stage.
  std::int64_t global_step() const;
  double last_loss() const;
  const StepMetrics& last_metrics() const;
  torch::ScalarType compute_dtype() const;
  ModelStateBytes model_state_bytes() const;
  std::int64_t gradient_bytes() const;
  std::int64_t gradient_padding_bytes() const;
  /// As Engine's: the experts' part of the two above.
  std::int64_t expert_gradient_bytes() const;
  std::int64_t expert_gradient_padding_bytes() const;
  void set_tokens_per_sample(std::int64_t tokens);
  std::vector<torch::Tensor> master_parameters() const;
  const zero::ShardedModel* sharded_model() const;
  double loss_scale() const;
  std::int64_t skipped_steps() const;

 private:
  struct Built;
  static std::shared_ptr<Built> build(Runtime& runtime,
                                      const std::vector<pipeline::LayerSpec>& specs,
                                      pipeline::LossFunction loss,
                                      const PipelineEngineOptions& options);
  PipelineEngine(Runtime& runtime, std::shared_ptr<Built> built, const OptimizerSpec& spec);
  void reduce_tied_gradients();
  StepApplier& applier() const;

  std::shared_ptr<Built> built_;
};

}  // namespace parallax
