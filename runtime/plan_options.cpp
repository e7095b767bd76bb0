#include "parallax/runtime/plan_options.h"

#include "parallax/core/config_loader.h"

namespace parallax {
namespace {

// The Plan's enums number their values as core/config.h's do, so one cast converts
// either way; these assertions keep the two in step.
static_assert(static_cast<int>(OffloadTarget::kNone) == proto::TIER_NONE &&
              static_cast<int>(OffloadTarget::kCpu) == proto::TIER_CPU &&
              static_cast<int>(OffloadTarget::kNvme) == proto::TIER_NVME && proto::Tier_MAX == proto::TIER_NVME);
static_assert(static_cast<int>(Dtype::kFp32) == proto::DTYPE_FP32 &&
              static_cast<int>(Dtype::kBf16) == proto::DTYPE_BF16 &&
              static_cast<int>(Dtype::kFp16) == proto::DTYPE_FP16 && proto::Dtype_MAX == proto::DTYPE_FP16);
static_assert(static_cast<int>(TpStyle::kColumn) == proto::TP_COLUMN &&
              static_cast<int>(TpStyle::kRow) == proto::TP_ROW &&
              static_cast<int>(TpStyle::kVocabEmbedding) == proto::TP_VOCAB_EMBEDDING &&
              static_cast<int>(TpStyle::kVocabOutput) == proto::TP_VOCAB_OUTPUT &&
              static_cast<int>(TpStyle::kReplicate) == proto::TP_REPLICATE &&
              proto::TpStyle_MAX == proto::TP_REPLICATE);
static_assert(static_cast<int>(PipelineSchedule::kGPipe) == proto::SCHEDULE_GPIPE &&
              static_cast<int>(PipelineSchedule::k1F1B) == proto::SCHEDULE_1F1B &&
              static_cast<int>(PipelineSchedule::kInterleaved) == proto::SCHEDULE_INTERLEAVED &&
              static_cast<int>(PipelineSchedule::kZbH1) == proto::SCHEDULE_ZB_H1 &&
              proto::Schedule_MAX == proto::SCHEDULE_ZB_H1);
static_assert(static_cast<int>(PipelinePartition::kUniform) == proto::PARTITION_UNIFORM &&
              static_cast<int>(PipelinePartition::kParameters) == proto::PARTITION_PARAMETERS &&
              static_cast<int>(PipelinePartition::kProfile) == proto::PARTITION_PROFILE &&
              static_cast<int>(PipelinePartition::kExplicit) == proto::PARTITION_EXPLICIT &&
              proto::Partition_MAX == proto::PARTITION_EXPLICIT);
static_assert(static_cast<int>(Recompute::kNone) == proto::RECOMPUTE_NONE &&
              static_cast<int>(Recompute::kFull) == proto::RECOMPUTE_FULL &&
              proto::Recompute_MAX == proto::RECOMPUTE_FULL);

template <typename To, typename From>
To same_value(From value) {
  return static_cast<To>(static_cast<int>(value));
}

}  // namespace

void record_strategy(const Config& config, proto::Plan& plan) {
  const ParallelOptions& p = config.parallel;
  plan.mutable_degrees()->set_tp(p.tp);
  plan.mutable_degrees()->set_pp(p.pp);
  plan.mutable_degrees()->set_dp(p.dp);
  plan.set_axis_order(to_string(p.order));
  plan.set_comm_backend("mpi");

  proto::Batch& batch = *plan.mutable_batch();
  batch.set_micro_batch_size(config.train.micro_batch_size);
  batch.set_grad_accum(config.train.grad_accum);
  batch.set_global_batch_size(config.train.global_batch_size);
  batch.set_steps(config.train.steps);
  batch.set_seed(config.train.seed);

  const ZeroOptions& z = config.zero;
  proto::Zero& zero = *plan.mutable_zero();
  zero.set_stage(z.stage);
  zero.set_bucket_mb(z.bucket_mb);
  zero.set_overlap_comm(z.overlap_comm);
  zero.set_prefetch_mb(z.prefetch_mb);
  zero.set_persistence_threshold(z.persistence_threshold);
  zero.set_max_live_mb(z.max_live_mb);
  zero.set_reshard_after_forward(z.reshard_after_forward);
  zero.set_reshard_after_backward(z.reshard_after_backward);
  for (const std::string& type : z.wrap) zero.add_wrap(type);
  zero.set_wrap_min_params(z.wrap_min_params);
  zero.set_bucket_bytes(z.bucket_bytes());

  const OffloadOptions& o = config.offload;
  proto::Offload& offload = *plan.mutable_offload();
  offload.set_optimizer(same_value<proto::Tier>(o.optimizer));
  offload.set_param(same_value<proto::Tier>(o.param));
  offload.set_pin_memory(o.pin_memory);
  offload.set_nvme_path(o.nvme_path);
  offload.set_buffer_mb(o.buffer_mb);
  offload.set_buffer_count(o.buffer_count);

  const PrecisionOptions& pr = config.precision;
  proto::Precision& precision = *plan.mutable_precision();
  precision.set_dtype(same_value<proto::Dtype>(pr.dtype));
  precision.set_dtype_position(config.position_of("precision.dtype"));
  precision.set_loss_scale_initial(pr.loss_scale_initial);
  precision.set_loss_scale_growth_interval(pr.loss_scale_growth_interval);
  precision.set_loss_scale_backoff(pr.loss_scale_backoff);
  precision.set_loss_scale_hysteresis(pr.loss_scale_hysteresis);
  precision.set_loss_scale_min(pr.loss_scale_min);

  const TensorParallelOptions& t = config.tensor_parallel;
  proto::TensorParallel& tp = *plan.mutable_tensor_parallel();
  tp.set_sequence_parallel(t.sequence_parallel);
  tp.set_sequence_dim(t.sequence_dim);
  for (const TpPlanRule& r : t.plan) {
    proto::TensorParallelRule& rule = *tp.add_rules();
    rule.set_pattern(r.pattern);
    rule.set_style(same_value<proto::TpStyle>(r.style));
    rule.set_parts(r.parts);
    rule.set_heads(r.heads);
    rule.set_gather_output(r.gather_output);
    rule.set_position(r.position);
  }

  const PipelineOptions& pi = config.pipeline;
  proto::Pipeline& pipeline = *plan.mutable_pipeline();
  pipeline.set_schedule(same_value<proto::Schedule>(pi.schedule));
  pipeline.set_virtual_stages(pi.virtual_stages);
  pipeline.set_partition(same_value<proto::Partition>(pi.partition));
  for (std::int64_t b : pi.boundaries) pipeline.add_boundaries(b);
  pipeline.set_recompute(same_value<proto::Recompute>(pi.recompute));
}

TrainOptions batch_options(const proto::Plan& plan) {
  TrainOptions train;
  train.micro_batch_size = plan.batch().micro_batch_size();
  train.grad_accum = plan.batch().grad_accum();
  train.global_batch_size = plan.batch().global_batch_size();
  train.steps = plan.batch().steps();
  train.seed = plan.batch().seed();
  return train;
}

ZeroOptions zero_options(const proto::Plan& plan) {
  const proto::Zero& z = plan.zero();
  ZeroOptions zero;
  zero.stage = z.stage();
  zero.bucket_mb = z.bucket_mb();
  zero.overlap_comm = z.overlap_comm();
  zero.prefetch_mb = z.prefetch_mb();
  zero.persistence_threshold = z.persistence_threshold();
  zero.max_live_mb = z.max_live_mb();
  zero.reshard_after_forward = z.reshard_after_forward();
  zero.reshard_after_backward = z.reshard_after_backward();
  zero.wrap.assign(z.wrap().begin(), z.wrap().end());
  zero.wrap_min_params = z.wrap_min_params();
  return zero;
}

OffloadOptions offload_options(const proto::Plan& plan) {
  const proto::Offload& o = plan.offload();
  OffloadOptions offload;
  offload.optimizer = same_value<OffloadTarget>(o.optimizer());
  offload.param = same_value<OffloadTarget>(o.param());
  offload.pin_memory = o.pin_memory();
  offload.nvme_path = o.nvme_path();
  offload.buffer_mb = o.buffer_mb();
  offload.buffer_count = o.buffer_count();
  return offload;
}

PrecisionOptions precision_options(const proto::Plan& plan) {
  const proto::Precision& p = plan.precision();
  PrecisionOptions precision;
  precision.dtype = same_value<Dtype>(p.dtype());
  precision.loss_scale_initial = p.loss_scale_initial();
  precision.loss_scale_growth_interval = p.loss_scale_growth_interval();
  precision.loss_scale_backoff = p.loss_scale_backoff();
  precision.loss_scale_hysteresis = p.loss_scale_hysteresis();
  precision.loss_scale_min = p.loss_scale_min();
  return precision;
}

TensorParallelOptions tensor_parallel_options(const proto::Plan& plan) {
  const proto::TensorParallel& t = plan.tensor_parallel();
  TensorParallelOptions tp;
  tp.sequence_parallel = t.sequence_parallel();
  tp.sequence_dim = t.sequence_dim();
  for (const proto::TensorParallelRule& r : t.rules()) {
    TpPlanRule rule;
    rule.pattern = r.pattern();
    rule.style = same_value<TpStyle>(r.style());
    rule.parts = r.parts();
    rule.heads = r.heads();
    rule.gather_output = r.gather_output();
    rule.position = r.position();
    tp.plan.push_back(std::move(rule));
  }
  return tp;
}

PipelineOptions pipeline_options(const proto::Plan& plan) {
  const proto::Pipeline& p = plan.pipeline();
  PipelineOptions pipeline;
  pipeline.schedule = same_value<PipelineSchedule>(p.schedule());
  pipeline.virtual_stages = p.virtual_stages();
  pipeline.partition = same_value<PipelinePartition>(p.partition());
  pipeline.boundaries.assign(p.boundaries().begin(), p.boundaries().end());
  pipeline.recompute = same_value<Recompute>(p.recompute());
  return pipeline;
}

const char* to_string(proto::Dtype dtype) {
  return parallax::to_string(same_value<Dtype>(dtype));
}
const char* to_string(proto::Tier tier) {
  return parallax::to_string(same_value<OffloadTarget>(tier));
}
const char* to_string(proto::Schedule schedule) {
  return parallax::to_string(same_value<PipelineSchedule>(schedule));
}
const char* to_string(proto::Partition partition) {
  return parallax::to_string(same_value<PipelinePartition>(partition));
}
const char* to_string(proto::Recompute recompute) {
  return parallax::to_string(same_value<Recompute>(recompute));
}
const char* to_string(proto::TpStyle style) {
  return parallax::to_string(same_value<TpStyle>(style));
}

}  // namespace parallax
