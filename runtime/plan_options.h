// The Plan's strategy, both ways: recorded from a resolved config by make_plan, and read
// back as the option structs the strategy modules take (internal to runtime/; the
// engines build themselves from the Plan alone through these).
//
//   proto::Plan plan;
//   record_strategy(config, plan);                  // make_plan does this
//   zero::ShardedModel sharded(..., zero_options(plan), offload_options(plan), ...);
#pragma once

#include "parallax/core/config.h"
#include "proto/plan.pb.h"

namespace parallax {

/// Writes config's degrees, axis order, batch, [zero], [offload], [precision],
/// [tensor_parallel] and [pipeline] into `plan` (placement is make_plan's). Every field
/// of those sections is kept, so each reader below returns exactly what was recorded.
void record_strategy(const Config& config, proto::Plan& plan);

TrainOptions batch_options(const proto::Plan& plan);
ZeroOptions zero_options(const proto::Plan& plan);
OffloadOptions offload_options(const proto::Plan& plan);
PrecisionOptions precision_options(const proto::Plan& plan);
TensorParallelOptions tensor_parallel_options(const proto::Plan& plan);
PipelineOptions pipeline_options(const proto::Plan& plan);

/// "fp32" | "bf16" | "fp16", "none" | "cpu" | "nvme", "1f1b", ...: the config's
/// spelling of a Plan's enum values, for messages and explain().
const char* to_string(proto::Dtype dtype);
const char* to_string(proto::Tier tier);
const char* to_string(proto::Schedule schedule);
const char* to_string(proto::Partition partition);
const char* to_string(proto::Recompute recompute);
const char* to_string(proto::TpStyle style);

}  // namespace parallax
