// Times of a transformer's layers on this machine, for the planner (auto_layout.h): a
// block and the LM head with its loss, built from ATen operations of the model's own
// shapes (TransformerShape) at each micro-batch size and tensor-parallel split a plan
// may use, forward and backward timed while every rank does the same (so a rank's time
// is what it gets when its neighbours compute too). The ranks' mean is shared from rank
// 0, so every rank plans from the same figures.
#pragma once

#include <cstdint>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/planner/plan_search.h"

namespace parallax {

class Communicator;

/// Forward and backward seconds of one block and of the head, by (micro-batch, tp).
struct LayerProfile {
  planner::LayerTimeTable block;
  planner::LayerTimeTable head;
};

/// Profiles `model` in `dtype` at every micro-batch of `micro_batches` and every split
/// of `tps` (those that divide its heads), on every rank of `comm` at once (the median
/// of three runs after a warm-up); returns the ranks' mean, identical on every rank.
/// Collective over `comm`.
LayerProfile profile_layers(const planner::TransformerShape& model,
                            Dtype dtype,
                            const std::vector<std::int64_t>& micro_batches,
                            const std::vector<int>& tps,
                            Communicator& comm);

}  // namespace parallax
