#include "parallax/pipeline/executor.h"

#include <torch/autograd.h>

#include "parallax/core/cpu_generator.h"
#include "parallax/core/error.h"
#include "parallax/pipeline/split_backward.h"

namespace parallax::pipeline {
namespace {

// The pairs (output, gradient) a backward starts from: outputs that require grad and
// have a defined gradient.
void backward_roots(const Activation& outputs,
                    const Activation& grads,
                    std::vector<torch::Tensor>& roots,
                    std::vector<torch::Tensor>& root_grads) {
  PARALLAX_CHECK(outputs.size() == grads.size(), UsageError, "a pipeline part produced ", outputs.size(),
                 " output tensor(s) but received ", grads.size(), " gradient(s) for them");
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad() && grads[i].defined()) {
      roots.push_back(outputs[i]);
      root_grads.push_back(grads[i]);
    }
  }
}

}  // namespace

struct StageExecutor::Slot {
  Activation input;        // the chunk's input (leaves that require grad where they carry gradients)
  Activation output;       // the chunk's output (not on the last part)
  torch::Tensor loss;      // last part: the micro-batch's loss
  Activation output_grad;  // received gradient of `output`
  Activation input_grad;   // computed gradient of `input`
  at::Tensor rng_state;    // recompute: the generator before the forward
  std::unique_ptr<detail::SplitBackward> split;  // zb-h1: between the input and weight passes
};

StageExecutor::StageExecutor(ScheduleShape shape,
                             int stage,
                             std::vector<LayerSequence> chunks,
                             Recompute recompute,
                             Transport& transport,
                             Tracer& tracer)
    : shape_(shape),
      stage_(stage),
      chunks_(std::move(chunks)),
      recompute_(recompute),
      transport_(transport),
      tracer_(tracer),
      instructions_(make_schedule(shape, stage)) {
  PARALLAX_CHECK(static_cast<int>(chunks_.size()) == shape.virtual_stages, UsageError, "stage ", stage, " got ",
                 chunks_.size(), " chunk(s) for ", shape.virtual_stages, " virtual stage(s)");
  for (std::size_t i = 0; i < instructions_.size(); ++i) {
    if (instructions_[i].op == Op::kBackward || instructions_[i].op == Op::kBackwardWeight) {
      last_weight_instruction_ = i;
    }
  }
  for (const LayerSequence& chunk : chunks_) {
    std::vector<torch::Tensor> params;
    for (const auto& p : chunk->parameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    chunk_parameters_.push_back(std::move(params));
  }
}

BatchOutcome StageExecutor::run(const std::vector<MicroBatch>& batch,
                                const LossFunction& loss_function,
                                const ExecutorHooks& hooks) {
  PARALLAX_CHECK(static_cast<int>(batch.size()) == shape_.micro_batches, UsageError, "train_batch got ", batch.size(),
                 " micro-batch(es); the schedule runs ", shape_.micro_batches, " (train.grad_accum)");
  const int parts = shape_.parts();
  const double loss_scale = hooks.loss_scale ? hooks.loss_scale() : 1.0;
  const double backward_scale = loss_scale / static_cast<double>(shape_.micro_batches);
  std::vector<Slot> slots(static_cast<std::size_t>(shape_.micro_batches) * shape_.virtual_stages);
  BatchOutcome outcome;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_ms = [&start] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };

  // A chunk's forward, inside the caller's scope (tensor-parallel rewrite) when it has one.
  auto forward = [this, &hooks](int chunk, const Activation& input) {
    Activation output;
    auto run = [&] { output = chunks_[chunk]->forward(input); };
    if (hooks.around_forward) {
      hooks.around_forward(run);
    } else {
      run();
    }
    return output;
  };

  // A backward instruction's autograd, through the caller's reduction when it has one.
  auto backward = [this, &hooks](std::size_t index, const std::function<void()>& run) {
    if (!hooks.around_backward) {
      run();
      return;
    }
    WeightGradients writes = WeightGradients::kSome;
    if (instructions_[index].op == Op::kBackwardInput) writes = WeightGradients::kNone;
    if (index == last_weight_instruction_) writes = WeightGradients::kLast;
    hooks.around_backward(writes, run);
  };

  for (std::size_t index = 0; index < instructions_.size(); ++index) {
    const Instruction& in = instructions_[index];
    Slot* slot = in.micro_batch >= 0
                     ? &slots[static_cast<std::size_t>(in.micro_batch) * shape_.virtual_stages + in.chunk]
                     : nullptr;
    const int part = part_of(shape_, stage_, in.chunk);
    const bool last_part = part == parts - 1;
    const double op_start_ms = elapsed_ms();
    const std::int64_t op_start_us = tracer_.now_us();
    switch (in.op) {
      case Op::kRecvActivation:
        slot->input = transport_.recv(in.peer, Stream::kActivation);
        break;
      case Op::kRecvGradient:
        slot->output_grad = transport_.recv(in.peer, Stream::kGradient);
        break;
      case Op::kSendActivation:
        transport_.send(slot->output, in.peer, Stream::kActivation);
        // Without autograd (recompute) the output is only data: the backward makes it again.
        if (recompute_ == Recompute::kFull) slot->output = {};
        break;
      case Op::kSendGradient:
        transport_.send(slot->input_grad, in.peer, Stream::kGradient);
        slot->input_grad = {};
        break;
      case Op::kForward: {
        if (part == 0) slot->input = batch[in.micro_batch].inputs;
        const bool recompute = recompute_ == Recompute::kFull;
        Activation output;
        if (recompute) {
          slot->rng_state = cpu_generator_state();
          {
            torch::NoGradGuard no_grad;
            output = forward(in.chunk, slot->input);
          }
          // Without autograd nothing requires grad; the next stage must still return the
          // gradient of every floating-point output (a float that needs none is skipped
          // when the replayed backward starts).
          for (torch::Tensor& t : output) {
            if (t.defined() && t.is_floating_point()) t.requires_grad_(true);
          }
        } else {
          output = forward(in.chunk, slot->input);
        }
        if (last_part) {
          torch::Tensor loss = loss_function(output, batch[in.micro_batch].targets);
          PARALLAX_CHECK(loss.dim() == 0, UsageError, "the pipeline loss function must return a scalar, got shape ",
                         loss.sizes());
          outcome.loss_sum += loss.detach().to(torch::kFloat64).item<double>();
          if (!recompute) slot->loss = loss;
        } else {
          slot->output = output;
        }
        break;
      }
      case Op::kBackward:
      case Op::kBackwardInput: {
        if (recompute_ == Recompute::kFull) {
          // Replay the forward with autograd, drawing what it drew the first time.
          Activation output;
          {
            RestoreCpuGenerator restore;
            set_cpu_generator_state(slot->rng_state);
            output = forward(in.chunk, slot->input);
          }
          if (last_part) {
            slot->loss = loss_function(output, batch[in.micro_batch].targets);
          } else {
            slot->output = output;
          }
        }
        const double scale = last_part ? backward_scale : 1.0;
        if (in.op == Op::kBackward) {
          backward(index, [&] { backward_whole(*slot, scale); });
        } else {
          backward(index, [&] { backward_input(*slot, in.chunk, scale); });
        }
        break;
      }
      case Op::kBackwardWeight:
        backward(index, [&] { backward_weight(*slot); });
        break;
      case Op::kReduceGradients:
        transport_.wait_sends();
        if (hooks.reduce_gradients) hooks.reduce_gradients();
        break;
      case Op::kReduceTiedGradients:
        if (hooks.reduce_tied_gradients) hooks.reduce_tied_gradients();
        break;
      case Op::kOptimizerStep:
        if (hooks.optimizer_step) hooks.optimizer_step(outcome);
        break;
    }
    const bool compute = is_compute(in.op);
    if (compute) {
      const double now_ms = elapsed_ms();
      outcome.compute_ms += now_ms - op_start_ms;
      outcome.schedule_ms = now_ms;
    }
    tracer_.record(to_string(in.op), compute ? "compute" : "pipeline", op_start_us, tracer_.now_us() - op_start_us,
                   in.micro_batch, in.chunk);
  }
  return outcome;
}

// The roots a backward starts from: the scaled loss on the last part, else the outputs
// with their received gradients.
void StageExecutor::roots_of(const Slot& slot,
                             double scale,
                             std::vector<torch::Tensor>& roots,
                             std::vector<torch::Tensor>& grads) const {
  if (slot.loss.defined()) {
    roots.push_back(slot.loss * scale);
  } else {
    backward_roots(slot.output, slot.output_grad, roots, grads);
  }
}

void StageExecutor::backward_whole(Slot& slot, double scale) {
  std::vector<torch::Tensor> roots;
  std::vector<torch::Tensor> grads;
  roots_of(slot, scale, roots, grads);
  if (!roots.empty()) torch::autograd::backward(roots, grads);
  Activation input_grad;
  for (const torch::Tensor& t : slot.input) {
    input_grad.push_back(t.defined() && t.requires_grad() ? t.grad() : torch::Tensor());
  }
  slot = Slot();
  slot.input_grad = std::move(input_grad);
}

void StageExecutor::backward_input(Slot& slot, int chunk, double scale) {
  std::vector<torch::Tensor> roots;
  std::vector<torch::Tensor> grads;
  roots_of(slot, scale, roots, grads);
  slot.split = std::make_unique<detail::SplitBackward>(std::move(roots), std::move(grads), slot.input,
                                                       chunk_parameters_[chunk], slot.input_grad);
  // What the weight pass needs is held by the graph and `split`.
  slot.output = {};
  slot.output_grad = {};
  slot.loss = torch::Tensor();
}

void StageExecutor::backward_weight(Slot& slot) {
  slot.split->weight_pass();
  slot = Slot();
}

}  // namespace parallax::pipeline
