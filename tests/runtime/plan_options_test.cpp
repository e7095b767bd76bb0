// The Plan holds every strategy option the engines apply (runtime/plan_options.h): a
// config with each field away from its default, recorded into a Plan, sent through its
// wire format and read back, gives the same options. A field the recording missed (a
// section not marked in_plan, a key its writer skips) would reach the engines as its
// default, silently.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "parallax/runtime/plan_options.h"

namespace {

using namespace parallax;

Config every_field_set() {
  Config config;
  config.parallel.tp = 2;
  config.parallel.pp = 2;
  config.parallel.dp = 3;
  config.parallel.cp = 2;
  config.parallel.order = AxisOrder::kTpPpDp;
  config.train = {48, 2, 4, 77, 99};  // global, micro, grad_accum, steps, seed
  ZeroOptions& z = config.zero;
  z.stage = 3;
  z.bucket_mb = 1.5;
  z.overlap_comm = false;
  z.prefetch_mb = 2.25;
  z.persistence_threshold = 1000;
  z.max_live_mb = 12.5;
  z.reshard_after_forward = false;
  z.reshard_after_backward = false;
  z.wrap = {"Block", "Head"};
  z.wrap_min_params = 4096;
  OffloadOptions& o = config.offload;
  o.optimizer = OffloadTarget::kNvme;
  o.param = OffloadTarget::kNvme;
  o.pin_memory = false;
  o.nvme_path = "/scratch/parallax";
  o.buffer_mb = 8.5;
  o.buffer_count = 6;
  PrecisionOptions& p = config.precision;
  p.dtype = Dtype::kFp16;
  p.loss_scale_initial = 1024.0;
  p.loss_scale_growth_interval = 50;
  p.loss_scale_backoff = 0.25;
  p.loss_scale_hysteresis = 3;
  p.loss_scale_min = 2.0;
  config.positions["precision.dtype"] = " at run.toml:4:9";
  TensorParallelOptions& t = config.tensor_parallel;
  t.sequence_parallel = true;
  t.sequence_dim = -3;
  t.plan.push_back({"blocks.*.qkv", TpStyle::kColumn, 3, 4, false, " at run.toml:9:1"});
  t.plan.push_back({"head", TpStyle::kVocabOutput, 1, 0, true, " at run.toml:10:1"});
  t.plan.push_back({"wte", TpStyle::kVocabEmbedding, 1, 0, false, ""});
  t.plan.push_back({"blocks.*.proj", TpStyle::kRow, 1, 4, false, ""});
  t.plan.push_back({"ln", TpStyle::kReplicate, 1, 0, false, ""});
  config.context_parallel.method = ContextMethod::kAllToAll;
  config.context_parallel.load_balance = false;
  config.context_parallel.sequence_dim = 2;
  PipelineOptions& pi = config.pipeline;
  pi.schedule = PipelineSchedule::kZbH1;
  pi.virtual_stages = 2;
  pi.partition = PipelinePartition::kExplicit;
  pi.boundaries = {0, 3, 5, 7, 9};
  pi.recompute = Recompute::kFull;
  return config;
}

// The plan after a trip through its wire format, as another process would receive it.
proto::Plan through_the_wire(const Config& config) {
  proto::Plan recorded;
  record_strategy(config, recorded);
  proto::Plan received;
  EXPECT_TRUE(received.ParseFromString(recorded.SerializeAsString()));
  return received;
}

TEST(PlanOptions, EveryStrategyFieldSurvivesThePlan) {
  const Config config = every_field_set();
  const proto::Plan plan = through_the_wire(config);

  EXPECT_EQ(plan.degrees().tp(), 2);
  EXPECT_EQ(plan.degrees().pp(), 2);
  EXPECT_EQ(plan.degrees().dp(), 3);
  EXPECT_EQ(plan.degrees().cp(), 2);
  EXPECT_EQ(plan.axis_order(), "tp-pp-dp");

  const TrainOptions train = batch_options(plan);
  EXPECT_EQ(train.global_batch_size, 48);
  EXPECT_EQ(train.micro_batch_size, 2);
  EXPECT_EQ(train.grad_accum, 4);
  EXPECT_EQ(train.steps, 77);
  EXPECT_EQ(train.seed, 99);

  const ZeroOptions zero = zero_options(plan);
  EXPECT_EQ(zero.stage, 3);
  EXPECT_EQ(zero.bucket_mb, 1.5);
  EXPECT_EQ(zero.bucket_bytes(), config.zero.bucket_bytes());
  EXPECT_FALSE(zero.overlap_comm);
  EXPECT_EQ(zero.prefetch_mb, 2.25);
  EXPECT_EQ(zero.persistence_threshold, 1000);
  EXPECT_EQ(zero.max_live_mb, 12.5);
  EXPECT_FALSE(zero.reshard_after_forward);
  EXPECT_FALSE(zero.reshard_after_backward);
  EXPECT_EQ(zero.wrap, config.zero.wrap);
  EXPECT_EQ(zero.wrap_min_params, 4096);

  const OffloadOptions offload = offload_options(plan);
  EXPECT_EQ(offload.optimizer, OffloadTarget::kNvme);
  EXPECT_EQ(offload.param, OffloadTarget::kNvme);
  EXPECT_FALSE(offload.pin_memory);
  EXPECT_EQ(offload.nvme_path, "/scratch/parallax");
  EXPECT_EQ(offload.buffer_mb, 8.5);
  EXPECT_EQ(offload.buffer_count, 6);

  const PrecisionOptions precision = precision_options(plan);
  EXPECT_EQ(precision.dtype, Dtype::kFp16);
  EXPECT_EQ(precision.loss_scale_initial, 1024.0);
  EXPECT_EQ(precision.loss_scale_growth_interval, 50);
  EXPECT_EQ(precision.loss_scale_backoff, 0.25);
  EXPECT_EQ(precision.loss_scale_hysteresis, 3);
  EXPECT_EQ(precision.loss_scale_min, 2.0);
  EXPECT_EQ(recorded_position(plan, "precision.dtype"), " at run.toml:4:9");

  const TensorParallelOptions tp = tensor_parallel_options(plan);
  EXPECT_TRUE(tp.sequence_parallel);
  EXPECT_EQ(tp.sequence_dim, -3);
  ASSERT_EQ(tp.plan.size(), config.tensor_parallel.plan.size());
  // The rules come back in key order, as the loader reads them from a file (a module
  // matched by two rules is an error, so their order carries no meaning).
  std::vector<TpPlanRule> wanted = config.tensor_parallel.plan;
  std::sort(wanted.begin(), wanted.end(), [](const auto& a, const auto& b) { return a.pattern < b.pattern; });
  for (std::size_t i = 0; i < tp.plan.size(); ++i) {
    const TpPlanRule& want = wanted[i];
    const TpPlanRule& got = tp.plan[i];
    EXPECT_EQ(got.pattern, want.pattern);
    EXPECT_EQ(got.style, want.style) << want.pattern;
    EXPECT_EQ(got.parts, want.parts) << want.pattern;
    EXPECT_EQ(got.heads, want.heads) << want.pattern;
    EXPECT_EQ(got.gather_output, want.gather_output) << want.pattern;
    EXPECT_EQ(got.position, want.position) << want.pattern;
  }

  const ContextParallelOptions cp = recorded_strategy(plan).context_parallel;
  EXPECT_EQ(cp.method, ContextMethod::kAllToAll);
  EXPECT_FALSE(cp.load_balance);
  EXPECT_EQ(cp.sequence_dim, 2);

  const PipelineOptions pipeline = pipeline_options(plan);
  EXPECT_EQ(pipeline.schedule, PipelineSchedule::kZbH1);
  EXPECT_EQ(pipeline.virtual_stages, 2);
  EXPECT_EQ(pipeline.partition, PipelinePartition::kExplicit);
  EXPECT_EQ(pipeline.boundaries, config.pipeline.boundaries);
  EXPECT_EQ(pipeline.recompute, Recompute::kFull);
}

// The defaults travel too: proto3 drops a field at its zero value, so a default that is
// not zero (bucket_mb 25, overlap_comm true, ...) must still come back as itself.
TEST(PlanOptions, DefaultsSurviveThePlan) {
  const Config config;
  const proto::Plan plan = through_the_wire(config);
  const ZeroOptions zero = zero_options(plan);
  EXPECT_EQ(zero.bucket_mb, config.zero.bucket_mb);
  EXPECT_EQ(zero.overlap_comm, config.zero.overlap_comm);
  EXPECT_EQ(zero.prefetch_mb, config.zero.prefetch_mb);
  EXPECT_EQ(zero.reshard_after_forward, config.zero.reshard_after_forward);
  const OffloadOptions offload = offload_options(plan);
  EXPECT_EQ(offload.pin_memory, config.offload.pin_memory);
  EXPECT_EQ(offload.buffer_count, config.offload.buffer_count);
  const PrecisionOptions precision = precision_options(plan);
  EXPECT_EQ(precision.dtype, Dtype::kFp32);
  EXPECT_EQ(precision.loss_scale_initial, config.precision.loss_scale_initial);
  EXPECT_EQ(tensor_parallel_options(plan).sequence_dim, config.tensor_parallel.sequence_dim);
  const PipelineOptions pipeline = pipeline_options(plan);
  EXPECT_EQ(pipeline.schedule, PipelineSchedule::k1F1B);
  EXPECT_EQ(pipeline.partition, PipelinePartition::kParameters);
  EXPECT_EQ(pipeline.virtual_stages, 1);
  EXPECT_EQ(recorded_position(plan, "precision.dtype"), "");
}

// The strategy is recorded as the config's own text, so a plan written by a build that
// knows a key this one does not is refused by name, not read as defaults.
TEST(PlanOptions, AStrategyThisBuildCannotReadIsRefused) {
  proto::Plan plan = through_the_wire(every_field_set());
  EXPECT_NE(plan.strategy().find("[zero]\nstage = 3\n"), std::string::npos) << plan.strategy();
  plan.set_strategy(plan.strategy() + "[expert_parallel]\n");
  EXPECT_NO_THROW(recorded_strategy(plan));  // a section this build does not record is not read
  std::string text = plan.strategy();
  text.insert(text.find("[zero]\n") + 7, "sharding = \"hybrid\"\n");
  plan.set_strategy(text);
  try {
    recorded_strategy(plan);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("zero.sharding"), std::string::npos) << error.what();
  }
  plan.set_strategy("[zero]\nstage = 1\n");
  EXPECT_THROW(recorded_strategy(plan), ConfigError);  // no [train]
}

}  // namespace
