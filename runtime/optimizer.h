// Optimizer construction and the learning-rate schedule.
//
// Parallax uses LibTorch's own optimizers (torch::optim::SGD, Adam, AdamW, RMSprop,
// Adagrad) so a distributed run and a plain single-process run step identically; the
// engine decides which tensors they see (the model's parameters, or fp32 masters under bf16). Where
// every parameter is a contiguous fp32 CPU tensor, the engine's Adam and AdamW keep
// LibTorch's classes, options and state but step each parameter in one fused pass
// (offload/cpu_adam.h: one read of parameter, gradient and moments, one write) instead
// of LibTorch's ~10 operator passes; results agree to within float rounding.
//
//   auto spec = OptimizerSpec::from(rt.config());
//   double lr = scheduled_lr(spec, /*step=*/0);     // the lr of the first optimizer step
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "parallax/core/config.h"

namespace parallax {

/// What the engine needs to build and drive the optimizer.
struct OptimizerSpec {
  OptimizerOptions optimizer;
  SchedulerOptions scheduler;
  /// Optimizer steps of the whole run (for decay schedules), e.g. train.steps.
  std::int64_t total_steps = 1;
  /// When set, each step's learning rate is the lr of this optimizer's first parameter
  /// group at that step instead of the schedule's (a trainer's own optimizer, whose lr
  /// the trainer may change; runtime/trainer_optimizer.h). It must outlive the engine.
  /// Default: none.
  const torch::optim::Optimizer* lr_source = nullptr;
  /// A tensor in the first parameter group of the trainer's own optimizer, whose
  /// zero_grad() then clears the engine's gradients (release_trainer_optimizer).
  /// Default: none.
  torch::Tensor zero_grad_sentinel{};
  /// Parameter groups with options of their own, as a trainer's optimizer carries them
  /// (e.g. no weight decay on biases and norms): group k's options (group 0's are
  /// `optimizer`), and each trained parameter's name → its group. Every group's learning
  /// rate keeps its ratio to group 0's through the schedule, as LibTorch's schedulers
  /// scale each group's. Default: none (one group, `optimizer`).
  std::vector<OptimizerOptions> parameter_groups;
  std::map<std::string, std::size_t> group_of;

  /// [optimizer], [scheduler] and train.steps of a loaded config.
  static OptimizerSpec from(const Config& config);
};

/// Learning rate of optimizer step `step` (0-based): linear warmup from lr/warmup to lr
/// over `warmup_steps`, then constant, linear or cosine decay to `min_lr` at
/// `total_steps`. Pure; throws UsageError for step < 0.
double scheduled_lr(const OptimizerSpec& spec, std::int64_t step);

/// The learning rate optimizer step `step` uses: spec.lr_source's current lr when set,
/// else scheduled_lr(spec, step).
double learning_rate(const OptimizerSpec& spec, std::int64_t step);

/// How Adam and AdamW step: LibTorch's own step, or the fused CPU pass where every
/// parameter allows it (LibTorch's step otherwise). SGD always steps as LibTorch's.
enum class AdamKernel { kLibTorch, kFusedCpu };

/// A LibTorch optimizer over `params` with the options' hyper-parameters.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        std::vector<torch::Tensor> params,
                                                        AdamKernel kernel = AdamKernel::kLibTorch);

/// Parameter groups of their own options over the tensors an engine steps.
struct OptimizerGroups {
  /// Group k's options; every group has the type of group 0. Never empty.
  std::vector<OptimizerOptions> options;
  /// Per tensor stepped (a parameter, or a flat group's master shard), its group.
  std::vector<std::size_t> of;
  /// Each group's learning rate relative to group 0's (options[k].lr / options[0].lr).
  std::vector<double> lr_ratios() const;
};

/// With spec.optimizer.no_decay set: two parameter groups, spec.optimizer and the same
/// with weight_decay 0, the second holding `model`'s parameters of the kinds no_decay
/// names (core/config.h; "norm" by LibTorch's normalization modules and every other 1-D
/// parameter but a bias, "embedding" by torch::nn::Embedding and EmbeddingBag), each
/// under `name_of`(its name in `model`) in spec.group_of. Does nothing without no_decay.
/// Throws ConfigError when the spec already has parameter groups (a trainer's optimizer
/// of several): the groups are given in one place or the other.
/// `decided`, where it returns a value, decides a parameter itself (a pipeline's tied
/// copy takes its first holder's decision: StageCoupling::tied_exempt).
void exempt_from_weight_decay(OptimizerSpec& spec,
                              const torch::nn::Module& model,
                              const std::function<std::string(const std::string&)>& name_of = {},
                              const std::function<std::optional<bool>(const torch::Tensor&)>& decided = {});

/// Whether optimizer.no_decay's `kinds` exempt `param`, as exempt_from_weight_decay
/// decides it, by the first module of `model` (itself included) that holds it; false
/// when none does.
bool exempt_from_decay(const torch::nn::Module& model,
                       const torch::Tensor& param,
                       const std::vector<std::string>& kinds);

/// `spec`'s parameter groups over the parameters named `names` (an engine's trained
/// parameters, by their names in the whole model): one group, spec.optimizer, when the
/// spec has no parameter_groups. Throws UsageError naming a parameter no group holds.
OptimizerGroups optimizer_groups(const OptimizerSpec& spec, const std::vector<std::string>& names);

/// A LibTorch optimizer with one parameter group per group of `groups` that holds any of
/// `params` (params[i] in group groups.of[i]), each with its own options. Throws
/// UsageError when groups.of does not cover `params`.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerGroups& groups,
                                                        std::vector<torch::Tensor> params,
                                                        AdamKernel kernel = AdamKernel::kLibTorch);

/// Parameter steps `optimizer` (from make_optimizer with kFusedCpu) has taken in the
/// fused pass; 0 for any other optimizer.
std::int64_t fused_parameter_steps(const torch::optim::Optimizer& optimizer);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);
/// Sets parameter group k's learning rate to lr × `ratios`[k] (an optimizer from the
/// grouped make_optimizer, whose groups are `groups`' non-empty ones in order).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr, const OptimizerGroups& groups);

/// Bytes of optimizer state the optimizer holds now (moments, momentum buffers).
std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

/// The state tensors `optimizer` (from make_optimizer) keeps for `param`, one of the
/// tensors it steps, by name: Adam's and AdamW's "exp_avg", "exp_avg_sq" (and
/// "max_exp_avg_sq" under amsgrad), SGD's "momentum_buffer" (with momentum), RMSprop's
/// "square_avg" (and "momentum_buffer", "grad_avg"), Adagrad's "sum"; empty before
/// the parameter's first step. With `create`, missing state is made first (zeros, step
/// count 0), for a checkpoint to fill in.
std::vector<std::pair<std::string, torch::Tensor>> optimizer_state(torch::optim::Optimizer& optimizer,
                                                                   const torch::Tensor& param,
                                                                   bool create);
/// Makes each of `params`' state in `optimizer` now, as its first step would make it
/// (zeros, step count 0: stepping from it is stepping without it), so that the state's
/// memory is held from the start and a parameter that steps skip (no gradient) still
/// has its share, as ZeRO's formulas count it. Nothing for SGD, whose first step takes
/// the gradient itself as the momentum buffer.
void create_optimizer_state(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params);
/// Adam/AdamW/RMSprop/Adagrad: the step count of the parameters' state (LibTorch keeps
/// one per parameter; the engine steps them together), 0 before the first step and for SGD.
std::int64_t optimizer_steps(const torch::optim::Optimizer& optimizer);
/// Sets the step count of every parameter's state; nothing for SGD.
void set_optimizer_steps(torch::optim::Optimizer& optimizer, std::int64_t steps);
/// The step count of `param`'s state: LibTorch keeps one per parameter, and a step that
/// skips the parameter (no gradient) does not count it. 0 before its first step and for SGD.
std::int64_t parameter_steps(torch::optim::Optimizer& optimizer, const torch::Tensor& param);
/// Sets it (state zeroed at count 0 steps as no state would). Nothing for SGD.
void set_parameter_steps(torch::optim::Optimizer& optimizer, const torch::Tensor& param, std::int64_t steps);

}  // namespace parallax
