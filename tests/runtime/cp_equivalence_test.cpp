// Context parallelism computes what one process computes: the GPT example trained with
// each sequence split over cp ranks (alone, and times dp) must match a plain
// single-process LibTorch run of the same global batch, step by step (losses) and at the
// end (parameters), for ring and all-to-all attention, balanced and contiguous splits,
// every ZeRO stage with and without the optimizer offloaded, and cp × tp with and
// without sequence parallelism (cp inside pipeline stages: matrix_equivalence_test).
// On LibTorch 2.x the same cells run the model written with scaled_dot_product_attention
// (model.attention = "sdpa"), which the engine intercepts: the reference runs the same
// model, SDPA unintercepted, on one process.
//
// Mutants these tests catch (each tried once):
//   - gradients reduced over dp only instead of dp × cp: each cp rank steps with its own
//     positions' gradient, and the replicas drift apart;
//   - positions embedded as 0..S/cp-1 on every rank instead of the split's global ones;
//   - the batch split along the sequence with the contiguous chunks while attention
//     assumes the balanced ones: the causal mask lets queries see future keys;
//   - SDPA not intercepted (the attention layer never opened): each rank's attention sees
//     its own positions only, and the engine's check refuses the forward;
//   - the intercepted call's is_causal or scale ignored (the handle's kept whatever the
//     call asks): InterceptedAttentionTakesTheCallsMaskAndScale.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <optional>
#include <string>
#include <vector>

#include "gpt_training.h"
#include "parallax/context_parallel/context_parallel.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/runtime/parallax.h"

namespace {

using namespace equivalence;

struct Cell {
  std::string name;
  std::vector<std::string> overrides;
};
void PrintTo(const Cell& cell, std::ostream* out) {
  *out << cell.name;
}

// model.attention = "sdpa" needs LibTorch 2.x: the cells that ask for it are skipped on 1.13.
bool needs_missing_sdpa(const Cell& cell) {
  for (const auto& o : cell.overrides) {
    if (o.find("sdpa") != std::string::npos) return TORCH_VERSION_MAJOR < 2;
  }
  return false;
}

class ContextParallelEquivalence : public ::testing::TestWithParam<Cell> {};

// cp = the world size (dp = 1), and cp = 2 × dp = world / 2 where the world allows.
TEST_P(ContextParallelEquivalence, MatchesSingleProcessFp32) {
  if (needs_missing_sdpa(GetParam())) GTEST_SKIP() << "scaled_dot_product_attention needs LibTorch 2.x";
  const int world = parallax::create_mpi_world_communicator()->size();
  std::vector<int> cps{world};
  if (world >= 4) cps.push_back(2);
  for (int cp : cps) {
    SCOPED_TRACE("cp = " + std::to_string(cp) + ", dp = " + std::to_string(world / cp));
    std::vector<std::string> overrides = GetParam().overrides;
    overrides.push_back("parallel.cp=" + std::to_string(cp));
    const auto config = make_config(1, overrides);
    const Trajectory reference = train_reference(config);
    const DistributedRun run = train_distributed(config);
    expect_equivalent(run.trajectory, reference, kFp32LossTolerance, kFp32ParameterTolerance);
    EXPECT_LT(reference.losses.back(), reference.losses.front());
  }
}

INSTANTIATE_TEST_SUITE_P(Cells,
                         ContextParallelEquivalence,
                         ::testing::Values(Cell{"ring", {}},
                                           Cell{"ring_contiguous", {"context_parallel.load_balance=false"}},
                                           Cell{"all_to_all", {"context_parallel.method=\"all_to_all\""}},
                                           Cell{"ring_zero1", {"zero.stage=1"}},
                                           Cell{"ring_zero2", {"zero.stage=2"}},
                                           Cell{"ring_zero3", {"zero.stage=3"}},
                                           Cell{"all_to_all_zero3_offload",
                                                {"context_parallel.method=\"all_to_all\"", "zero.stage=3",
                                                 "offload.optimizer=\"cpu\""}},
                                           Cell{"ring_zero2_offload", {"zero.stage=2", "offload.optimizer=\"cpu\""}},
                                           Cell{"sdpa_ring", {"model.attention=\"sdpa\""}},
                                           Cell{"sdpa_all_to_all_zero3",
                                                {"model.attention=\"sdpa\"", "context_parallel.method=\"all_to_all\"",
                                                 "zero.stage=3"}}),
                         [](const ::testing::TestParamInfo<Cell>& info) { return info.param.name; });

// The step metrics count context parallelism's traffic and the gradient reduction over
// dp × cp, exactly: with the ring at cp = the world (dp 1, ZeRO 0), every rank sends per
// step and attention layer (4(cp − 1) + 2cp)·B, B the bytes of its K (docs/context-
// parallelism.md's table), and all-reduces the gradient bytes once (and a byte per parameter). Mutant caught (tried
// once): the telemetry counting the dp, tp, pp and world groups only (no send, no
// all-reduce in the metrics).
TEST(ContextParallelMetrics, EveryStepCountsTheRingAndTheReductionOverTheReplicas) {
  const int cp = parallax::create_mpi_world_communicator()->size();
  const auto config = make_config(1, {"parallel.cp=" + std::to_string(cp)});
  const DistributedRun run = train_distributed(config);
  const std::int64_t layers = 2, d_model = 32;  // make_config's
  const std::int64_t block_size = config.app_table("model").get_int("block_size");
  const std::int64_t key_bytes = kGlobalBatch * (block_size / cp) * d_model * 4;
  for (const auto& m : run.metrics) {
    ASSERT_EQ(static_cast<int>(m.comm.size()), cp);
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(m.comm[r][parallax::CommOp::kSend].bytes, layers * (4 * (cp - 1) + 2 * cp) * key_bytes) << "rank " << r;
      // and a byte per parameter: which have gradients (gradient_presence.h).
      EXPECT_EQ(m.comm[r][parallax::CommOp::kAllReduce].bytes,
                run.gradient_bytes + run.padding_bytes + static_cast<std::int64_t>(run.trajectory.params.size()))
          << "rank " << r;
    }
  }
}

// cp × tp on 4 ranks: configs/tp.toml's plan splits each block's heads over tp, and each
// tensor-parallel rank's heads attend across its own cp group (the ranks of its tp
// coordinate); with sequence parallelism the tp group further splits this rank's part of
// the sequence between the blocks. Each rank's part of every parameter is compared.
class ContextTimesTensorParallel : public ::testing::TestWithParam<Cell> {};

TEST_P(ContextTimesTensorParallel, MatchesSingleProcessFp32) {
  const int world = parallax::create_mpi_world_communicator()->size();
  if (world != 4) GTEST_SKIP() << "cp 2 × tp 2";
  if (needs_missing_sdpa(GetParam())) GTEST_SKIP() << "scaled_dot_product_attention needs LibTorch 2.x";
  std::vector<std::string> overrides{"parallel.cp=2", "parallel.tp=2", "zero.wrap=[\"Block\"]"};
  overrides.insert(overrides.end(), GetParam().overrides.begin(), GetParam().overrides.end());
  expect_tp_matches_reference(make_config(1, overrides, "tp.toml"), 2);
}

INSTANTIATE_TEST_SUITE_P(
    Cells,
    ContextTimesTensorParallel,
    ::testing::Values(Cell{"ring", {}},
                      Cell{"ring_sp", {"tensor_parallel.sequence_parallel=true"}},
                      Cell{"all_to_all_sp_zero1", {"context_parallel.method=\"all_to_all\"",
                                                   "tensor_parallel.sequence_parallel=true", "zero.stage=1"}},
                      Cell{"ring_contiguous_zero3_offload",
                           {"context_parallel.load_balance=false", "zero.stage=3", "offload.optimizer=\"cpu\""}},
                      Cell{"sdpa_ring_sp", {"model.attention=\"sdpa\"", "tensor_parallel.sequence_parallel=true"}}),
    [](const ::testing::TestParamInfo<Cell>& info) { return info.param.name; });

// What the strategy matrix does not run yet is refused by name, with the nearest cell.
TEST(ContextParallelRefusals, CudaAndTheAutomaticModeAreRefusedWithTheNearestCell) {
  for (const std::string& other : {std::string("train.device=\"cuda\""), std::string("parallel.mode=\"auto\"")}) {
    parallax::Config config = make_config(1, {"parallel.cp=2", other});
    try {
      parallax::Runtime rt(std::move(config), {{"model", "data"}, /*print_summary=*/false});
      ADD_FAILURE() << other << " with cp = 2 was not refused";
    } catch (const parallax::ConfigError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("parallel.cp = 2"), std::string::npos) << what;
      EXPECT_NE(what.find("instead: "), std::string::npos) << what;
    }
  }
}

// A model whose attention ignores context parallelism (scores written out, not the cp
// handle's attention, not SDPA) would train silently wrong at cp > 1: its first forward
// is refused. Mutant caught: the engine's check removed (the forward returns).
struct PlainAttentionImpl : torch::nn::Module {
  PlainAttentionImpl() { proj = register_module("proj", torch::nn::Linear(8, 8)); }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor q = proj->forward(x);
    return torch::matmul(torch::softmax(torch::matmul(q, q.transpose(-2, -1)), -1), q);
  }
  torch::nn::Linear proj{nullptr};
};

TEST(ContextParallelRefusals, AForwardWithNoContextParallelAttentionIsRefused) {
  const int world = parallax::create_mpi_world_communicator()->size();
  parallax::Runtime rt(make_config(1, {"parallel.cp=" + std::to_string(world)}),
                       {{"model", "data"}, /*print_summary=*/false});
  auto model = std::make_shared<PlainAttentionImpl>();
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(rt.config()));
  try {
    engine.forward(engine.local_sequence(torch::randn({1, 4 * world, 8})));
    ADD_FAILURE() << "a forward with no context-parallel attention was not refused";
  } catch (const parallax::UsageError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("no context-parallel attention"), std::string::npos) << what;
    EXPECT_NE(what.find("current()->attention"), std::string::npos) << what;
  }
}

#if TORCH_VERSION_MAJOR >= 2
// A model written with SDPA, unaware of Parallax, as the engine runs it at cp = the world
// size: each call's own is_causal and scale hold, so each rank's output is its part of
// the one-process output. Mutant caught: the handle's options used instead of the call's
// (causal and 1/√head_dim: the non-causal, scaled outputs differ).
struct SdpaAttentionImpl : torch::nn::Module {
  SdpaAttentionImpl(bool causal, std::optional<double> scale) : causal(causal), scale(scale) {
    proj = register_module("proj", torch::nn::Linear(8, 24));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto qkv = proj->forward(x).view({x.size(0), x.size(1), 3, 4, 2}).permute({2, 0, 3, 1, 4});
    auto y = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, causal, scale);
    return y.transpose(1, 2).reshape({x.size(0), x.size(1), 8});
  }
  bool causal;
  std::optional<double> scale;
  torch::nn::Linear proj{nullptr};
};

TEST(ContextParallelInterception, InterceptedAttentionTakesTheCallsMaskAndScale) {
  const int world = parallax::create_mpi_world_communicator()->size();
  for (const std::string method : {"ring", "all_to_all"}) {
    parallax::Runtime rt(make_config(1, {"parallel.cp=" + std::to_string(world),
                                         "context_parallel.method=\"" + method + "\""}),
                         {{"model", "data"}, /*print_summary=*/false});
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(method + (causal ? ", causal" : ", not causal"));
      torch::manual_seed(5);
      auto model = std::make_shared<SdpaAttentionImpl>(causal, 0.3);
      const torch::Tensor x = torch::randn({2, 4 * world, 8});
      const torch::Tensor whole = model->forward(x).detach();
      auto engine = rt.engine(model, parallax::OptimizerSpec::from(rt.config()));
      const torch::Tensor mine = engine.forward(engine.local_sequence(x)).detach();
      const double error = (mine - engine.local_sequence(whole)).abs().max().item<double>();
      EXPECT_LT(error, 2e-6);  // measured up to 1.8e-7 (np2, np4)
    }
  }
}

// What context parallelism cannot split is refused by name, not run wrong.
TEST(ContextParallelInterception, AMaskOrDropoutInTheCallIsRefused) {
  const int world = parallax::create_mpi_world_communicator()->size();
  parallax::Runtime rt(make_config(1, {"parallel.cp=" + std::to_string(world)}),
                       {{"model", "data"}, /*print_summary=*/false});
  const auto cp = parallax::context_parallel::ContextParallel(rt.mesh().cp(), {}, true, 1);
  const parallax::context_parallel::ContextParallel::Scope scope(cp);
  const torch::Tensor q = torch::randn({1, 2, 4, 4});
  auto refusal = [&](auto&& call) {
    try {
      call();
    } catch (const parallax::UsageError& error) {
      return std::string(error.what());
    }
    return std::string("not refused");
  };
  const std::string mask =
      refusal([&] { at::scaled_dot_product_attention(q, q, q, torch::ones({4, 4 * world}, torch::kBool)); });
  EXPECT_NE(mask.find("attn_mask"), std::string::npos) << mask;
  const std::string dropout = refusal([&] { at::scaled_dot_product_attention(q, q, q, {}, 0.1); });
  EXPECT_NE(dropout.find("dropout_p = 0.1"), std::string::npos) << dropout;
}
#endif

}  // namespace

