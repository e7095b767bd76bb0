// Which flat groups a ShardedModel builds over a model's parameters, in reduction order:
// stage 3's units (the modules `zero.wrap` / `zero.wrap_min_params` select, children
// before parents, later blocks first, then a root unit with what is left) and the
// replicated buckets (every parameter below stage 3; at stage 3 those of at most
// `persistence_threshold` elements), each at most `bucket_bytes` of fp32 gradient.
// Pure: no communication, no change to the model.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "parallax/core/config.h"

namespace parallax::zero {

/// One collective carries at most INT_MAX elements (MPI counts in an int): no group is larger.
constexpr std::int64_t kMaxGroupElements = std::numeric_limits<int>::max();

struct GroupPlan {
  /// Stage 3: each unit's parameters (indices into `params`); empty below stage 3.
  std::vector<std::vector<std::size_t>> units;
  /// Each unit named for messages: its first parameter's name, "and N more".
  std::vector<std::string> unit_names;
  /// The replicated buckets' parameters (indices into `params`).
  std::vector<std::vector<std::size_t>> replicated;
};

/// Plans the groups of `params` (distinct trainable parameters of `model`). Throws
/// ConfigError for a `zero.wrap` type that matches no module holding parameters.
GroupPlan plan_groups(torch::nn::Module& model, const std::vector<torch::Tensor>& params, const ZeroOptions& options);

}  // namespace parallax::zero
