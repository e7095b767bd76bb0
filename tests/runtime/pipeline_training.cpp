#include "pipeline_training.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <set>

#include "figures.h"
#include "gpt.h"
#include "gpt_training.h"
#include "parallax/core/mesh.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/world.h"
#include "parallax/pipeline/partition.h"
#include "parallax/runtime/parallax.h"
#include "parallax/zero/sharded_model.h"

namespace equivalence {
namespace {

// The reference's parameter for pipeline layer `layer`'s parameter `name` ("qkv.weight").
std::string reference_name(std::int64_t layer, std::int64_t layers, const std::string& name) {
  if (layer == 0) return name;           // token_embedding.weight, position_embedding.weight
  if (layer == layers - 1) return name;  // ln_f.*, head.weight
  return "blocks." + std::to_string(layer - 1) + "." + name;
}

constexpr const char* kTiedHead = "token_embedding.weight#head";
// bf16 runs: the least share of the fp32 masters' elements that are not bf16 values
// after training. Measured 0.99987-1.00000 (4 and 8 ranks); masters rounded to bf16
// after each step (stage 0's or ZeRO's write-back mutated) give 0.00000.
constexpr double kMastersFinerThanBf16 = 0.999;

}  // namespace

PipelineRun train_pipeline(parallax::Config config) {
  parallax::Runtime rt(std::move(config), {{"model", "data"}, /*print_summary=*/false});
  const auto& c = rt.config();
  const auto options = gpt::GPTOptions::from_table(c.app_table("model"));
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, c.train.seed);
  const int dp_rank = rt.mesh().coord().dp, dp = rt.mesh().degrees().dp;
  auto micro_batch = [&](std::int64_t step, std::int64_t micro) {
    auto [inputs, targets] =
        data.batch(gpt::first_sample(step, micro, dp_rank, dp, c.train.micro_batch_size, c.train.grad_accum),
                   c.train.micro_batch_size);
    return parallax::pipeline::MicroBatch{{inputs}, {targets}};
  };
  parallax::PipelineEngineOptions engine_options;
  engine_options.profile_batch = micro_batch(0, 0);
  parallax::PipelineEngine engine(rt, gpt::layer_specs(options), parallax::CrossEntropyLoss{},
                                  parallax::OptimizerSpec::from(c), engine_options);
  PipelineRun run;
  const parallax::GroupTraffic traffic(rt);
  run.tp_rank = rt.mesh().coord().tp;
  run.tp = rt.mesh().degrees().tp;
  run.zero_stage = engine.sharded_model() != nullptr ? engine.sharded_model()->stage() : 0;
  run.reduced_bytes = engine.gradient_bytes() + engine.gradient_padding_bytes();
  run.world_rank = rt.world().rank();
  for (std::int64_t step = 0; step < kSteps; ++step) {
    std::int64_t micro = 0;
    run.losses.push_back(engine.train_batch([&] { return micro_batch(step, micro++); }));
    run.metrics.push_back(engine.last_metrics());
  }
  // Parameters are read through the masters below: at ZeRO-3 a released one holds no data.
  run.held = engine.model_state_bytes();
  // ZeRO shards over the replicas: dp × cp ranks.
  // Experts (parallel.ep) over the ranks holding them.
  run.formula = parallax::model_state_formula(engine.gradient_bytes() / 4, engine.gradient_padding_bytes() / 4,
                                              rt.mesh().replicas().size(), engine.expert_gradient_bytes() / 4,
                                              engine.expert_gradient_padding_bytes() / 4,
                                              rt.mesh().expert_replicas().size(), c.zero.stage, c.precision.dtype,
                                              parallax::optimizer_bytes_per_element(c.optimizer));
  const auto layers = static_cast<std::int64_t>(gpt::layer_specs(options).size());
  // The optimizer's view (fp32 masters under bf16), in the stage's parameter order with
  // a weight two chunks share counted once, as the engine keeps them.
  const std::vector<torch::Tensor> masters = engine.master_parameters();
  std::size_t next_master = 0;
  std::map<const void*, torch::Tensor> master_of;  // by parameter
  for (const auto& chunk : engine.chunks()) {
    for (const auto& item : chunk->named_parameters()) {
      if (master_of.count(item.value().unsafeGetTensorImpl())) continue;
      const std::string& key = item.key();
      const auto dot = key.find('.');
      const std::int64_t layer = std::stoll(key.substr(0, dot));
      std::string name = reference_name(layer, layers, key.substr(dot + 1));
      // A tied head compares against the one shared weight of the reference.
      if (options.tie_embeddings && name == "head.weight") name = kTiedHead;
      const torch::Tensor& master = masters.at(next_master++);
      EXPECT_EQ(master.sizes(), item.value().sizes()) << key;
      run.params[name] = master.detach().clone();
      master_of[item.value().unsafeGetTensorImpl()] = run.params[name];
    }
  }
  EXPECT_EQ(next_master, masters.size());
  for (const auto& chunk : engine.chunks()) {
    for (const auto& [key, tensor] : chunk->tied_parameters())
      run.tied.push_back(master_of.at(tensor.unsafeGetTensorImpl()));
  }
  run.group_bytes = traffic.bytes_since();
  const parallax::MeshLayout& placed = rt.mesh().layout();
  const parallax::Cluster& cluster = rt.mesh().cluster();
  const int node = cluster.node_of(run.world_rank);
  auto nodes_of = [&](parallax::MeshAxis axis) {
    std::set<int> nodes;
    for (int member : placed.group(axis, run.world_rank)) nodes.insert(cluster.node_of(member));
    return nodes;
  };
  run.tp_group_in_one_node = nodes_of(parallax::MeshAxis::kTp) == std::set<int>{node};
  run.pp_group_nodes = static_cast<int>(nodes_of(parallax::MeshAxis::kPp).size());
  run.dp_group_nodes = static_cast<int>(nodes_of(parallax::MeshAxis::kDp).size());
  run.explain = rt.explain();

  run.layout = engine.layout();
  run.instructions = engine.instructions();
  return run;
}

void expect_pipeline_matches_reference(const parallax::Config& config,
                                       const std::string& label,
                                       double loss_tolerance,
                                       double param_tolerance,
                                       PipelineRun* run) {
  const Trajectory want = train_reference(config);
  PipelineRun local;
  PipelineRun& got = run != nullptr ? *run : local;
  got = train_pipeline(config);
  const auto options = gpt::GPTOptions::from_table(config.app_table("model"));
  gpt::GPT names_of(options, static_cast<std::uint64_t>(config.train.seed));
  std::map<std::string, torch::Tensor> reference;
  std::size_t index = 0;
  for (const auto& item : names_of->named_parameters()) {
    reference[item.key()] = planned_part(item.key(), want.params.at(index++), got.tp_rank, got.tp);
  }
  if (options.tie_embeddings) reference[kTiedHead] = reference.at("token_embedding.weight");

  ASSERT_EQ(got.zero_stage, config.zero.stage) << "the engine did not shard as configured";
  // Model state on the device by ZeRO's formulas (offload moves shards to the host,
  // which the offload tests account for).
  if (config.offload.optimizer == parallax::OffloadTarget::kNone) {
    EXPECT_EQ(got.held.params, got.formula.params);
    EXPECT_EQ(got.held.grads, got.formula.grads);
    EXPECT_EQ(got.held.optimizer, got.formula.optimizer);
  }
  ASSERT_EQ(got.losses.size(), want.losses.size());
  const double worst_loss = expect_losses_match(got.losses, want.losses, loss_tolerance, "pipeline");
  double worst_param = 0.0;
  ASSERT_FALSE(got.params.empty());
  for (const auto& [name, value] : got.params) {
    ASSERT_TRUE(reference.count(name)) << name;
    ASSERT_EQ(value.sizes(), reference.at(name).sizes()) << name;
    const double diff = (value - reference.at(name)).abs().max().item<double>();
    worst_param = std::max(worst_param, diff);
    EXPECT_LE(diff, param_tolerance) << name;
  }
  const auto world = static_cast<std::int64_t>(got.metrics.front().comm.size());
  if (config.zero.stage == 0 && got.tp == 1 && world == config.parallel.pp && config.optimizer.grad_clip > 0) {
    // A data-parallel group of one averages nothing: a step's only all-reduce is the
    // clipping norm's float64 over the pipeline. Mutant caught: each stage's gradient
    // buckets all-reduced over its group of one (a copy onto itself, counted).
    for (const auto& m : got.metrics) {
      for (std::size_t r = 0; r < m.comm.size(); ++r) {
        EXPECT_EQ(m.comm[r][parallax::CommOp::kAllReduce].bytes, 8) << "rank " << r << " step " << m.step;
      }
    }
  }
  if (config.precision.dtype == parallax::Dtype::kBf16) {
    // The masters are fp32: after a few Adam steps most of their elements hold bits below
    // bf16's resolution. Where the split sums keep a reduced-precision run from matching
    // the dense reference closely (the tp cells), this is what catches masters that are
    // rounded to bf16 after each step, or missing (the fraction is then 0).
    std::int64_t finer = 0;
    std::int64_t elements = 0;
    for (const auto& [name, value] : got.params) {
      finer += value.ne(value.to(torch::kBFloat16).to(torch::kFloat32)).sum().item<std::int64_t>();
      elements += value.numel();
    }
    const double fraction = static_cast<double>(finer) / static_cast<double>(elements);
    EXPECT_GE(fraction, kMastersFinerThanBf16) << "of the fp32 masters' elements hold bits below bf16's resolution";
    parallax_test::print_figure("%s: %.5f of the masters' elements are finer than bf16\n", label.c_str(), fraction);
  }
  // Every rank measured its bubble; the file records one per rank.
  EXPECT_EQ(got.metrics.back().bubble_fraction.size(),
            static_cast<std::size_t>(parallax::create_mpi_world_communicator()->size()));
  parallax_test::print_figure(
      "%s, %s: max per-step loss relative difference %.3g, max final parameter difference %.3g\n", label.c_str(),
      parallax::pipeline::describe_boundaries(got.layout.boundaries).c_str(), worst_loss, worst_param);
}

}  // namespace equivalence
