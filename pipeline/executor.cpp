#include "parallax/pipeline/executor.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>

#include <mutex>

#include "parallax/core/error.h"

namespace parallax::pipeline {
namespace {

bool writes_weight_gradients(Op op) {
  return op == Op::kBackward || op == Op::kBackwardWeight;
}

// A leaf copy of `value` for a new autograd segment: floating-point tensors that carry
// gradients become leaves that require grad; the rest pass as they are.
Activation cut(const Activation& value) {
  Activation leaves;
  for (const torch::Tensor& t : value) {
    leaves.push_back(t.defined() && t.requires_grad() ? t.detach().requires_grad_(true) : t);
  }
  return leaves;
}

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

// Swaps LibTorch's CPU generator state with `state` (for replaying a forward's dropout).
void swap_generator_state(at::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  at::Tensor current = generator.get_state();
  generator.set_state(state);
  state = current;
}

at::Tensor generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

}  // namespace

struct StageExecutor::Slot {
  Activation input;        // the chunk's input (leaves that require grad where they carry gradients)
  Activation output;       // the chunk's output (not on the last part)
  torch::Tensor loss;      // last part: the micro-batch's loss
  Activation output_grad;  // received gradient of `output`
  Activation input_grad;   // computed gradient of `input`
  at::Tensor rng_state;    // recompute: the generator before the forward
  // zb-h1: per layer, its input leaves, its outputs (the last part's last entry is the
  // scaled loss) and the gradient of those outputs that BackwardWeight starts from.
  std::vector<Activation> layer_inputs;
  std::vector<Activation> layer_outputs;
  std::vector<Activation> layer_output_grads;
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
    if (writes_weight_gradients(instructions_[i].op)) last_weight_instruction_ = i;
  }
}

Activation StageExecutor::forward_chunk(Slot& slot, int chunk, const Activation& input, bool keep_graph) {
  LayerSequenceImpl& sequence = *chunks_[chunk];
  if (shape_.kind != PipelineSchedule::kZbH1 || !keep_graph) return sequence.forward(input);
  slot.layer_inputs.clear();
  slot.layer_outputs.clear();
  Activation x = input;
  for (std::size_t i = 0; i < sequence.size(); ++i) {
    slot.layer_inputs.push_back(i == 0 ? x : cut(x));
    x = sequence.forward_layer(i, slot.layer_inputs.back());
    slot.layer_outputs.push_back(x);
  }
  return x;
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

  for (std::size_t index = 0; index < instructions_.size(); ++index) {
    const Instruction& in = instructions_[index];
    if (index == last_weight_instruction_ && hooks.before_last_weight_gradients) hooks.before_last_weight_gradients();
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
          slot->rng_state = generator_state();
          {
            torch::NoGradGuard no_grad;
            output = forward_chunk(*slot, in.chunk, slot->input, /*keep_graph=*/false);
          }
          // Without autograd nothing requires grad; the next stage must still return the
          // gradient of every floating-point output (a float that needs none is skipped
          // when the replayed backward starts).
          for (torch::Tensor& t : output) {
            if (t.defined() && t.is_floating_point()) t.requires_grad_(true);
          }
        } else {
          output = forward_chunk(*slot, in.chunk, slot->input, /*keep_graph=*/true);
        }
        if (last_part) {
          torch::Tensor loss = loss_function(output, batch[in.micro_batch].targets);
          PARALLAX_CHECK(loss.dim() == 0, UsageError, "the pipeline loss function must return a scalar, got shape ",
                         loss.sizes());
          outcome.loss_sum += loss.detach().to(torch::kFloat64).item<double>();
          if (!recompute) {
            slot->loss = loss;
            if (shape_.kind == PipelineSchedule::kZbH1) slot->layer_outputs.back() = {loss};
          }
        } else {
          slot->output = output;
        }
        break;
      }
      case Op::kBackward:
      case Op::kBackwardInput: {
        if (recompute_ == Recompute::kFull) {
          // Replay the forward with autograd, drawing what it drew the first time.
          at::Tensor state = slot->rng_state;
          swap_generator_state(state);
          Activation output = forward_chunk(*slot, in.chunk, slot->input, /*keep_graph=*/true);
          swap_generator_state(state);
          if (last_part) {
            slot->loss = loss_function(output, batch[in.micro_batch].targets);
            if (shape_.kind == PipelineSchedule::kZbH1) slot->layer_outputs.back() = {slot->loss};
          } else {
            slot->output = output;
          }
        }
        if (in.op == Op::kBackward) {
          backward_whole(*slot, in.chunk, last_part ? backward_scale : 1.0);
        } else {
          backward_input(*slot, in.chunk, last_part ? backward_scale : 1.0);
        }
        break;
      }
      case Op::kBackwardWeight:
        backward_weight(*slot, in.chunk);
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
    const bool compute =
        in.op == Op::kForward || in.op == Op::kBackward || in.op == Op::kBackwardInput || in.op == Op::kBackwardWeight;
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

void StageExecutor::backward_whole(Slot& slot, int chunk, double scale) {
  (void)chunk;
  std::vector<torch::Tensor> roots;
  std::vector<torch::Tensor> grads;
  if (slot.loss.defined()) {
    roots.push_back(slot.loss * scale);
  } else {
    backward_roots(slot.output, slot.output_grad, roots, grads);
  }
  if (!roots.empty()) torch::autograd::backward(roots, grads);
  slot.input_grad.clear();
  for (const torch::Tensor& t : slot.input) {
    slot.input_grad.push_back(t.defined() && t.requires_grad() ? t.grad() : torch::Tensor());
  }
  const Activation input_grad = std::move(slot.input_grad);
  slot = Slot();
  slot.input_grad = input_grad;
}

void StageExecutor::backward_input(Slot& slot, int chunk, double scale) {
  (void)chunk;
  const std::size_t layers = slot.layer_outputs.size();
  slot.layer_output_grads.assign(layers, {});
  if (slot.loss.defined()) {
    // The last layer's segment ends in the loss: start from loss × scale.
    slot.layer_outputs.back() = {slot.loss * scale};
    slot.layer_output_grads.back() = {torch::ones_like(slot.layer_outputs.back()[0])};
  } else {
    slot.layer_output_grads.back() = slot.output_grad;
  }
  for (std::size_t i = layers; i-- > 0;) {
    std::vector<torch::Tensor> roots;
    std::vector<torch::Tensor> grads;
    backward_roots(slot.layer_outputs[i], slot.layer_output_grads[i], roots, grads);
    const Activation& inputs = slot.layer_inputs[i];
    std::vector<torch::Tensor> wanted;
    for (const torch::Tensor& t : inputs) {
      if (t.defined() && t.requires_grad()) wanted.push_back(t);
    }
    std::vector<torch::Tensor> computed;
    if (!roots.empty() && !wanted.empty()) {
      computed = torch::autograd::grad(roots, wanted, grads, /*retain_graph=*/true, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    }
    Activation input_grad;
    std::size_t next = 0;
    for (const torch::Tensor& t : inputs) {
      input_grad.push_back(t.defined() && t.requires_grad() && next < computed.size() ? computed[next++]
                                                                                      : torch::Tensor());
    }
    if (i > 0) {
      slot.layer_output_grads[i - 1] = input_grad;
    } else {
      slot.input_grad = input_grad;
    }
  }
}

void StageExecutor::backward_weight(Slot& slot, int chunk) {
  LayerSequenceImpl& sequence = *chunks_[chunk];
  for (std::size_t i = 0; i < slot.layer_outputs.size(); ++i) {
    std::vector<torch::Tensor> roots;
    std::vector<torch::Tensor> grads;
    backward_roots(slot.layer_outputs[i], slot.layer_output_grads[i], roots, grads);
    const std::vector<torch::Tensor> params = sequence.layer_parameters(i);
    if (!roots.empty() && !params.empty()) {
      torch::autograd::backward(roots, grads, /*retain_graph=*/false, /*create_graph=*/false, params);
    }
  }
  slot = Slot();
}

}  // namespace parallax::pipeline
