#include "gpt_training.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <set>

#include "figures.h"
#include "gpt.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/mesh.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/runtime/parallax.h"

namespace equivalence {

parallax::Config make_config(std::int64_t grad_accum, const std::vector<std::string>& extra, const std::string& file) {
  parallax::ConfigSources sources;
  sources.files = {PARALLAX_SOURCE_DIR "/configs/" + file};
  sources.overrides = {"train.global_batch_size=" + std::to_string(kGlobalBatch),
                       "train.grad_accum=" + std::to_string(grad_accum),
                       "train.steps=" + std::to_string(kSteps),
                       "zero.bucket_mb=0.02",  // several buckets for a 100k-parameter model
                       "logging.every=0",
                       "model.n_layer=2",
                       "model.d_model=32"};
  // micro_batch_size is left out of gpt_base.toml: inferred from the world size.
  for (const auto& e : extra) sources.overrides.push_back(e);
  return parallax::load_config(sources, {{"model", "data"}});
}

namespace {

// bf16 as the engine runs it, in one process: bf16 parameters and activations, fp32
// masters made from them, the loss in fp32. Each micro-batch's bf16 gradients are summed
// in fp32, per data-parallel rank and then over the ranks, and divided by their count;
// LibTorch's optimizer steps the masters and they are copied back into the bf16
// parameters. It walks the global batch in the distributed run's micro-batches, so the
// two differ only in the order of fp32 sums over more than two ranks and in the fused
// Adam's rounding.
Trajectory train_bf16_reference(parallax::Config config) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  config.resolve(world);  // the micro-batch size the distributed run infers
  const auto options = gpt::GPTOptions::from_table(config.app_table("model"));
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, config.train.seed);
  gpt::GPT model(options, static_cast<std::uint64_t>(config.train.seed));
  // The masters start from the bf16 parameters, as DeepSpeed's and Megatron's do.
  model->to(torch::kBFloat16);
  const std::vector<torch::Tensor> params = model->parameters();
  std::vector<torch::Tensor> masters;
  for (const auto& p : params) {
    masters.push_back(p.detach().to(torch::kFloat32).requires_grad_(true));
    masters.back().mutable_grad() = torch::zeros_like(masters.back());
  }
  const auto spec = parallax::OptimizerSpec::from(config);
  auto optimizer = reference_optimizer(config, *model, masters, parallax::AdamKernel::kFusedCpu);
  const std::int64_t micro_batch = config.train.micro_batch_size, accum = config.train.grad_accum;
  const std::int64_t dp = config.parallel.dp;
  Trajectory out;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    double loss_sum = 0.0;
    for (std::int64_t rank = 0; rank < dp; ++rank) {
      // Each rank sums its own micro-batches first, as its buckets do before the all-reduce.
      std::vector<torch::Tensor> rank_sum;
      for (const auto& m : masters) rank_sum.push_back(torch::zeros_like(m));
      for (std::int64_t micro = 0; micro < accum; ++micro) {
        auto [inputs, targets] = data.batch(gpt::first_sample(step, micro, rank, dp, micro_batch, accum), micro_batch);
        auto loss = gpt::language_model_loss(model->forward(inputs).to(torch::kFloat32), targets);
        model->zero_grad();
        (loss * (1.0 / static_cast<double>(accum))).backward();  // as Engine::backward
        torch::NoGradGuard no_grad;
        for (std::size_t i = 0; i < params.size(); ++i) {
          if (params[i].grad().defined()) rank_sum[i].add_(params[i].grad().to(torch::kFloat32));
        }
        loss_sum += loss.item<double>();
      }
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < masters.size(); ++i) masters[i].mutable_grad().add_(rank_sum[i]);
    }
    torch::NoGradGuard no_grad;
    for (const auto& m : masters) m.mutable_grad().div_(static_cast<double>(dp));
    if (spec.optimizer.grad_clip > 0) torch::nn::utils::clip_grad_norm_(masters, spec.optimizer.grad_clip);
    parallax::set_learning_rate(*optimizer, parallax::scheduled_lr(spec, step));
    optimizer->step();
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].detach().copy_(masters[i]);
      masters[i].mutable_grad().zero_();
    }
    out.losses.push_back(loss_sum / static_cast<double>(dp * accum));
  }
  for (const auto& m : masters) out.params.push_back(m.detach().clone());
  return out;
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> reference_optimizer(const parallax::Config& config,
                                                             const torch::nn::Module& model,
                                                             std::vector<torch::Tensor> tensors,
                                                             parallax::AdamKernel kernel) {
  auto spec = parallax::OptimizerSpec::from(config);
  parallax::exempt_from_weight_decay(spec, model);
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  return parallax::make_optimizer(parallax::optimizer_groups(spec, names), std::move(tensors), kernel);
}

Trajectory train_reference(const parallax::Config& config) {
  if (config.precision.dtype == parallax::Dtype::kBf16) return train_bf16_reference(config);
  const auto options = gpt::GPTOptions::from_table(config.app_table("model"));
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, config.train.seed);
  gpt::GPT model(options, static_cast<std::uint64_t>(config.train.seed));
  const auto spec = parallax::OptimizerSpec::from(config);
  auto optimizer = reference_optimizer(config, *model, model->parameters());
  Trajectory out;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    auto [inputs, targets] = data.batch(step * kGlobalBatch, kGlobalBatch);
    auto loss = gpt::language_model_loss(model->forward(inputs), targets);
    optimizer->zero_grad();
    loss.backward();
    if (spec.optimizer.grad_clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), spec.optimizer.grad_clip);
    parallax::set_learning_rate(*optimizer, parallax::scheduled_lr(spec, step));
    optimizer->step();
    out.losses.push_back(loss.item<double>());
  }
  for (const auto& p : model->parameters()) out.params.push_back(p.detach().clone());
  return out;
}

DistributedRun train_distributed(parallax::Config config) {
  parallax::Runtime rt(std::move(config), {{"model", "data"}, /*print_summary=*/false});
  const auto& c = rt.config();
  const auto options = gpt::GPTOptions::from_table(c.app_table("model"));
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, c.train.seed);
  // Every rank seeds differently: the engine's broadcast must make them agree.
  gpt::GPT model(options, static_cast<std::uint64_t>(c.train.seed + 1000 * rt.world().rank()));
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(c));
  const int dp_rank = rt.mesh().coord().dp, dp = rt.mesh().degrees().dp;
  DistributedRun run;
  std::set<const void*> seen;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad() && seen.insert(item.value().unsafeGetTensorImpl()).second)
      run.names.push_back(item.key());
  }
  for (std::int64_t step = 0; step < kSteps; ++step) {
    for (std::int64_t micro = 0; micro < c.train.grad_accum; ++micro) {
      auto [inputs, targets] =
          data.batch(gpt::first_sample(step, micro, dp_rank, dp, c.train.micro_batch_size, c.train.grad_accum),
                     c.train.micro_batch_size);
      engine.backward(
          engine.cross_entropy(engine.forward(engine.local_sequence(inputs)), engine.local_sequence(targets)));
      EXPECT_EQ(engine.step(), micro + 1 == c.train.grad_accum);
    }
    run.trajectory.losses.push_back(engine.last_loss());
    run.metrics.push_back(engine.last_metrics());
  }
  run.trajectory.params = engine.master_parameters();
  run.held = engine.model_state_bytes();
  run.expert_gradient_bytes = engine.expert_gradient_bytes();
  run.expert_padding_bytes = engine.expert_gradient_padding_bytes();
  run.gradient_bytes = engine.gradient_bytes();
  run.padding_bytes = engine.gradient_padding_bytes();
  run.buckets = engine.bucket_count();
  for (const auto& p : run.trajectory.params) run.parameter_elements += p.numel();
  return run;
}

torch::Tensor planned_part(const std::string& name, const torch::Tensor& dense, int rank, int size) {
  auto chunk = [&](const torch::Tensor& t, std::int64_t dim) { return t.chunk(size, dim)[rank]; };
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (name == "token_embedding.weight" || name == "head.weight") return chunk(dense, 0);
  if (ends_with("qkv.weight") || ends_with("qkv.bias")) {
    std::vector<std::int64_t> blocks = dense.sizes().vec();
    blocks[0] /= 3;
    blocks.insert(blocks.begin(), 3);
    std::vector<std::int64_t> out = dense.sizes().vec();
    out[0] /= size;
    return chunk(dense.reshape(blocks), 1).reshape(out);
  }
  if (ends_with("fc.weight") || ends_with("fc.bias")) return chunk(dense, 0);
  if (ends_with("attn_proj.weight") || ends_with("mlp_proj.weight")) return chunk(dense, 1);
  // A mixture-of-experts block's experts under the MoE plan: fc1 by columns, fc2 by rows.
  if (ends_with("fc1.weight") || ends_with("fc1.bias")) return chunk(dense, 0);
  if (ends_with("fc2.weight")) return chunk(dense, 1);
  return dense;  // replicated
}

std::vector<torch::Tensor> planned_parts(const parallax::Config& config,
                                         const std::vector<torch::Tensor>& dense,
                                         int rank,
                                         int size) {
  const gpt::GPT names(gpt::GPTOptions::from_table(config.app_table("model")));
  std::vector<torch::Tensor> parts;
  std::size_t i = 0;
  for (const auto& p : names->named_parameters()) parts.push_back(planned_part(p.key(), dense.at(i++), rank, size));
  return parts;
}

double relative_difference(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-12);
}

double expect_losses_match(const std::vector<double>& got,
                           const std::vector<double>& want,
                           double tolerance,
                           const char* who) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double diff = relative_difference(got[i], want[i]);
    worst = std::max(worst, diff);
    EXPECT_LE(diff, tolerance) << "step " << i + 1 << ": " << who << " " << got[i] << " vs reference " << want[i];
  }
  return worst;
}

void expect_equivalent(const Trajectory& got, const Trajectory& want, double loss_tolerance, double param_tolerance) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  const double worst_loss = expect_losses_match(got.losses, want.losses, loss_tolerance, "distributed");
  double worst_param = 0.0;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (std::size_t i = 0; i < want.params.size(); ++i) {
    const double diff = (got.params[i] - want.params[i]).abs().max().item<double>();
    worst_param = std::max(worst_param, diff);
    EXPECT_LE(diff, param_tolerance) << "parameter " << i << " differs by " << diff;
  }
  // The figures the closing notes quote.
  parallax_test::print_figure("max per-step loss relative difference %.3g, max final parameter difference %.3g\n",
                              worst_loss, worst_param);
}

DistributedRun expect_tp_matches_reference(const parallax::Config& config, int tp) {
  const auto world = parallax::create_mpi_world_communicator();
  const Trajectory reference = train_reference(config);
  const DistributedRun run = train_distributed(config);

  // Each rank holds its part of every split parameter.
  const int tp_rank = world->rank() % tp;
  Trajectory want = reference;
  want.params = planned_parts(config, reference.params, tp_rank, tp);
  std::vector<torch::Tensor> replicated;
  for (std::size_t i = 0; i < want.params.size(); ++i) {
    if (want.params[i].numel() == reference.params[i].numel()) replicated.push_back(run.trajectory.params[i].flatten());
  }
  expect_equivalent(run.trajectory, want, kFp32LossTolerance, kFp32ParameterTolerance);

  // Replicated parameters (LayerNorms, row biases, the position embedding) are the same
  // bits on every rank of a tensor-parallel group.
  const torch::Tensor mine = torch::cat(replicated);
  torch::Tensor all = torch::empty({world->size(), mine.numel()});
  world->all_gather(all, mine)->wait();
  for (int r = 0; r < world->size(); ++r) {
    EXPECT_TRUE(torch::equal(all[r], all[r - r % tp])) << "rank " << r << " vs rank " << r - r % tp;
  }
  return run;
}

}  // namespace equivalence
