// The Plan's strategy, both ways: recorded from a resolved config by make_plan, and read
// back as the option structs the strategy modules take (internal to runtime/; the
// engines build themselves from the Plan alone through these).
//
// The strategy sections are recorded as the config's own TOML (strategy_toml) and read
// back through the same field tables that read the user's file, so an option is declared
// once, as a key of its config section: this file names no option.
//
//   proto::Plan plan;
//   record_strategy(config, plan);                  // make_plan does this
//   zero::ShardedModel sharded(..., zero_options(plan), offload_options(plan), ...);
#pragma once

#include <string>

#include "parallax/core/config.h"
#include "proto/plan.pb.h"

namespace parallax {

/// Writes config's degrees, axis order and strategy sections ([train], [precision],
/// [zero], [offload], [tensor_parallel], [pipeline]; with the positions of their keys)
/// into `plan` (placement is make_plan's). Every key of those sections is kept, so each
/// reader below returns exactly what was recorded.
void record_strategy(const Config& config, proto::Plan& plan);

/// A Config whose strategy sections (and their keys' positions) are the plan's, every
/// other section at its defaults. Parses the recorded text: call it once per
/// construction, not per step. Throws ConfigError for a plan written by another build.
Config recorded_strategy(const proto::Plan& plan);

TrainOptions batch_options(const proto::Plan& plan);
ZeroOptions zero_options(const proto::Plan& plan);
OffloadOptions offload_options(const proto::Plan& plan);
PrecisionOptions precision_options(const proto::Plan& plan);
TensorParallelOptions tensor_parallel_options(const proto::Plan& plan);
PipelineOptions pipeline_options(const proto::Plan& plan);

/// Where `key` ("precision.dtype") was set, " at run.toml:4:9", or "" at its default.
std::string recorded_position(const proto::Plan& plan, const std::string& key);

}  // namespace parallax
