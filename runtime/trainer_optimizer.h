// Taking over the optimizer a trainer already has (Runtime::engine(model, optimizer)).
//
//   torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(1e-2));
//   auto engine = rt.engine(model, optimizer);   // reads it, then empties it
//
// The engine never steps the trainer's object: it builds the same LibTorch optimizer
// (same type, same options) over what it trains (the parameters, the fp32 masters,
// this rank's ZeRO shard or the offloaded state), so the trainer's settings need not be
// copied into TOML. The trainer's object keeps its parameter groups' options but loses
// their parameters, so its own step() changes nothing of the model; its first group keeps
// one element the engine watches, so its zero_grad() clears the engine's gradients as it
// would have cleared the parameters' (zero/gradient_ledger.h): loops that still call
// both stay correct. Its learning rate stays live: unless the config sets optimizer.lr
// or a [scheduler] key, every step uses the lr of its first group at that step, so a
// schedule the trainer writes into it (group.options().set_lr(...)) applies. Its
// parameter groups may differ in options (lr, weight decay, betas, ...): each group
// steps with its own, its lr in the ratio to group 0's the groups started with, as
// LibTorch's schedulers keep it; with the optimizer offloaded they must agree.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/runtime/optimizer.h"
#include "parallax/runtime/runtime.h"

namespace parallax {

/// What the engine makes of a trainer's optimizer.
struct AdoptedOptimizer {
  OptimizerSpec spec;
  /// One line for each [optimizer] key the config sets to a value other than the
  /// trainer's (the config's value wins), e.g. "optimizer.lr = 0.001 at train.toml:3:6
  /// overrides the trainer's torch::optim::Adam lr = 0.01".
  std::vector<std::string> overrides;
};

/// Reads `optimizer` (torch::optim::SGD, Adam, AdamW, RMSprop or Adagrad) into the spec
/// the engine builds its own optimizer from: the trainer's type and options, except the
/// [optimizer] keys `config` sets explicitly (in every group); [scheduler],
/// optimizer.grad_clip and train.steps are the config's. Parameter groups whose options
/// differ become spec.parameter_groups (group 0's options are spec.optimizer; the
/// engine keeps each group's lr in its ratio to group 0's); spec.group_of is left to
/// adopt_trainer_optimizer. spec.lr_source is `&optimizer` unless the config sets
/// optimizer.lr or a [scheduler] key. Pure: changes nothing. Throws UsageError for
/// another optimizer class or for no parameter group; ConfigError when the config's
/// optimizer.type names another type than the trainer's.
AdoptedOptimizer read_trainer_optimizer(const Config& config, const torch::optim::Optimizer& optimizer);

/// Hands `optimizer` over to the engine: checks that its parameters are exactly the
/// trainable parameters of `model` (each once) and that it has not stepped, then empties
/// its parameter groups (their options stay) and its state, and puts one sentinel
/// element (returned) in its first group, for the engine to see its zero_grad(). Throws
/// UsageError naming a parameter the optimizer lacks or holds beyond the model, or
/// saying it has stepped; the optimizer is unchanged then.
torch::Tensor release_trainer_optimizer(torch::optim::Optimizer& optimizer, const torch::nn::Module& model);

/// What Runtime::engine(model, optimizer) does first: read_trainer_optimizer, the
/// overrides printed as warnings on rank 0, then release_trainer_optimizer. Returns the
/// spec to build the engine with.
OptimizerSpec adopt_trainer_optimizer(Runtime& runtime, const torch::nn::Module& model, torch::optim::Optimizer& optimizer);

}  // namespace parallax
