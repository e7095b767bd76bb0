// Shared by the equivalence tests: the GPT example trained by a plain single-process
// LibTorch loop (the reference) and by the engine on every rank of the world, with the
// same seed and global batch, and the comparison of the two.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/core/metrics.h"
#include "parallax/runtime/optimizer.h"

namespace equivalence {

constexpr std::int64_t kSteps = 10;
constexpr std::int64_t kGlobalBatch = 16;

/// fp32 bounds of the equivalence tests, from the worst measured over every fp32 test
/// on 1–8 ranks: per-step loss 2.3e-7 relative; final parameters 4.2e-6 under OpenBLAS's
/// SSE3 kernels and 1.05e-5 under its AVX-512 ones (fp32 rounding that Adam's
/// normalized steps carry through 10 steps). A skipped gradient reduction moves them by
/// orders of magnitude more (the closing note of the test-strength issue lists it).
constexpr double kFp32LossTolerance = 2e-6;
constexpr double kFp32ParameterTolerance = 3e-5;

/// configs/<file> (default gpt_base.toml) shrunk for tests (2 layers, d_model 32,
/// several buckets), with `grad_accum` and the `extra` overrides.
parallax::Config make_config(std::int64_t grad_accum,
                             const std::vector<std::string>& extra = {},
                             const std::string& file = "gpt_base.toml");

struct Trajectory {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;  // fp32, final
};

/// One process, the whole global batch, LibTorch's own optimizer and clipping.
Trajectory train_reference(const parallax::Config& config);

/// The optimizer the plain program builds from `config` over `tensors` (`model`'s
/// parameters in named_parameters() order, or fp32 copies of them): [optimizer], with
/// optimizer.no_decay's parameter group of weight_decay 0 as the engine makes it.
std::unique_ptr<torch::optim::Optimizer> reference_optimizer(
    const parallax::Config& config,
    const torch::nn::Module& model,
    std::vector<torch::Tensor> tensors,
    parallax::AdamKernel kernel = parallax::AdamKernel::kLibTorch);

struct DistributedRun {
  Trajectory trajectory;
  std::vector<parallax::StepMetrics> metrics;
  std::int64_t gradient_bytes = 0;
  std::int64_t padding_bytes = 0;
  std::size_t buckets = 0;
  std::int64_t parameter_elements = 0;  ///< trainable, counted once
  /// The model's name of each of trajectory.params (experts by global index under ep).
  std::vector<std::string> names;
  parallax::ModelStateBytes held;          ///< this rank's model state after training
  std::int64_t expert_gradient_bytes = 0;  ///< of gradient_bytes, the experts' (parallel.ep)
  std::int64_t expert_padding_bytes = 0;   ///< of padding_bytes, the experts'
};

/// The engine on every rank of the world (ranks start from different seeds; the
/// engine's broadcast must make them agree).
DistributedRun train_distributed(parallax::Config config);

/// The part of the dense parameter (or gradient) `name` that tensor-parallel rank
/// `rank` of `size` holds under configs/tp.toml's plan (and for a mixture-of-experts
/// block's experts, fc1 by columns and fc2 by rows); `dense` itself when replicated.
torch::Tensor planned_part(const std::string& name, const torch::Tensor& dense, int rank, int size);

/// planned_part of every parameter of the GPT `config` describes, `dense` in its
/// parameter order.
std::vector<torch::Tensor> planned_parts(const parallax::Config& config,
                                         const std::vector<torch::Tensor>& dense,
                                         int rank,
                                         int size);

double relative_difference(double a, double b);

/// Expects each step's loss within `tolerance` (relative) of the reference's, naming the
/// step and `who` ("pipeline", "distributed") on failure; returns the worst difference.
double expect_losses_match(const std::vector<double>& got,
                           const std::vector<double>& want,
                           double tolerance,
                           const char* who);

/// Per-step loss within `loss_tolerance` (relative) and final parameters within
/// `param_tolerance` (absolute); prints the worst of each as "[ figures  ]".
void expect_equivalent(const Trajectory& got, const Trajectory& want, double loss_tolerance, double param_tolerance);

/// The engine's run of `config` under configs/tp.toml's plan at `tp` (tp innermost in the
/// mesh, as one node lays it out), against the reference: each rank's part of every
/// parameter and the per-step losses within the fp32 bounds, and replicated parameters
/// bit-identical across the tensor-parallel group. Returns the run.
DistributedRun expect_tp_matches_reference(const parallax::Config& config, int tp);

}  // namespace equivalence
