// Runs one stage's instruction list (schedule.h) for one train_batch.
//
// Protocol, per instruction of the list:
//  - RecvActivation / RecvGradient: block on the Transport until the peer's transfer
//    arrives (bounded by the communicator's timeout).
//  - Forward(m, c): chunk c on micro-batch m's input (the batch's inputs on part 0, the
//    received activation elsewhere). On the last part the loss function runs too; its
//    value (a float) is added to the batch's loss. recompute = full: the forward runs
//    without autograd and keeps only its input and the CPU generator's state.
//  - Backward(m, c): recompute = full first replays the forward with autograd, from the
//    saved generator state; then one backward from the loss × loss_scale / micro-batches
//    (last part) or from the received output gradients, accumulating the weights'
//    gradients and computing the input's.
//  - BackwardInput / BackwardWeight (zb-h1): the backward in two passes over the same
//    graph (split_backward.h): the input gradients only, recording the gradient that
//    reaches each node feeding a parameter; later, from those nodes, the parameters'
//    gradients only. Exact: the weight gradients are those of a whole backward.
//  - SendActivation / SendGradient: non-blocking sends of the output or input gradient.
//  - ReduceGradients, ReduceTiedGradients, OptimizerStep: the hooks, in list order.
// Every backward runs through hooks.around_backward, which is told whether it writes
// weight gradients and whether for the last time (the data-parallel reduction arms
// itself for that one, and ZeRO reduces around each).
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/core/trace.h"
#include "parallax/pipeline/layers.h"
#include "parallax/pipeline/schedule.h"
#include "parallax/pipeline/transport.h"

namespace parallax::pipeline {

/// One micro-batch: the first stage reads `inputs`, the last reads `targets`.
struct MicroBatch {
  Activation inputs;
  Activation targets;
};

/// Loss of the last part's output against the micro-batch's targets: a scalar tensor.
using LossFunction = std::function<torch::Tensor(const Activation& output, const Activation& targets)>;

struct BatchOutcome;

/// What a backward instruction writes (ExecutorHooks::around_backward).
enum class WeightGradients {
  kNone,  ///< only the input's gradient (zb-h1's BackwardInput)
  kSome,  ///< weight gradients
  kLast,  ///< weight gradients, for the last time in this batch
};

struct ExecutorHooks {
  /// Runs a backward instruction's autograd (given as a callable) through the caller's
  /// gradient reduction, told what it writes; the autograd runs directly when empty.
  std::function<void(WeightGradients writes, const std::function<void()>& backward)> around_backward;
  std::function<void()> reduce_gradients;
  std::function<void()> reduce_tied_gradients;
  /// Gets the batch's outcome so far (every compute has run by then).
  std::function<void(const BatchOutcome&)> optimizer_step;
  /// Multiplies the loss before backward (fp16's dynamic scale); 1 when empty.
  std::function<double()> loss_scale;
  /// Runs a chunk's forward (given as a callable) inside the caller's scopes, e.g. the
  /// tensor-parallel rewrite; the forward runs directly when empty.
  std::function<void(const std::function<void()>& forward)> around_forward;
};

struct BatchOutcome {
  double loss_sum = 0.0;     ///< sum of the micro-batch losses (last stage only; 0 elsewhere)
  double compute_ms = 0.0;   ///< time in forward and backward compute
  double schedule_ms = 0.0;  ///< from the start of the list to the end of its last compute
};

class StageExecutor {
 public:
  /// `chunks[c]` is this stage's part c × stages + stage. The transport and tracer must
  /// outlive the executor.
  StageExecutor(ScheduleShape shape,
                int stage,
                std::vector<LayerSequence> chunks,
                Recompute recompute,
                Transport& transport,
                Tracer& tracer);

  /// Runs the list on `batch` (micro_batches entries; only the first and last stages
  /// read them). Throws what the loss, the model or the transport throw; after a throw
  /// the stage's state is undefined (the run should end).
  BatchOutcome run(const std::vector<MicroBatch>& batch, const LossFunction& loss, const ExecutorHooks& hooks);

  const std::vector<Instruction>& instructions() const { return instructions_; }

 private:
  struct Slot;
  void roots_of(const Slot& slot,
                double scale,
                std::vector<torch::Tensor>& roots,
                std::vector<torch::Tensor>& grads) const;
  void backward_whole(Slot& slot, double scale);
  void backward_input(Slot& slot, int chunk, double scale);
  void backward_weight(Slot& slot);

  ScheduleShape shape_;
  int stage_;
  std::vector<LayerSequence> chunks_;
  std::vector<std::vector<torch::Tensor>> chunk_parameters_;  // trainable, per chunk
  Recompute recompute_;
  Transport& transport_;
  Tracer& tracer_;
  std::vector<Instruction> instructions_;
  std::size_t last_weight_instruction_ = 0;
};

}  // namespace parallax::pipeline
