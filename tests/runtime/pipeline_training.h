// Shared by the pipeline equivalence tests: the GPT example's layer specs trained by the
// PipelineEngine on every rank of the world, and the comparison of each rank's stage
// (its tensor-parallel part, when tp > 1) with the single-process reference.
#pragma once

#include <torch/types.h>

#include <array>
#include <map>
#include <string>
#include <vector>

#include "gpt_training.h"
#include "parallax/core/config.h"
#include "parallax/core/metrics.h"
#include "parallax/pipeline/schedule.h"
#include "parallax/runtime/explain.h"
#include "parallax/runtime/pipeline_engine.h"

namespace equivalence {

struct PipelineRun {
  std::vector<double> losses;
  std::vector<parallax::StepMetrics> metrics;
  std::map<std::string, torch::Tensor> params;  // this stage's, by reference name
  parallax::PipelineLayout layout;
  std::vector<parallax::pipeline::Instruction> instructions;
  std::vector<torch::Tensor> tied;  // this stage's copies of tied weights, after training
  int tp_rank = 0;
  int tp = 1;
  int zero_stage = 0;              ///< of the engine's ZeRO state (0 without)
  std::int64_t reduced_bytes = 0;  ///< gradient payload + padding one reduction of every bucket moves
  int world_rank = 0;
  // Placement, from the mesh the run was placed on:
  bool tp_group_in_one_node = true;           ///< every member of this rank's tp group is on its node
  int pp_group_nodes = 1;                     ///< distinct nodes this rank's pp group spans
  int dp_group_nodes = 1;                     ///< distinct nodes this rank's dp group spans
  parallax::GroupBytes group_bytes{};  ///< bytes this rank's tp, pp, replica, cp groups moved in training
  std::string explain;                        ///< Runtime::explain()
  parallax::ModelStateBytes held;             ///< this rank's, after training
  parallax::ModelStateBytes formula;          ///< parallax::model_state_formula for this rank
};

/// The PipelineEngine on every rank of the world, kSteps optimizer steps.
PipelineRun train_pipeline(parallax::Config config);

/// Per-step loss within `loss_tolerance` (relative) on every rank, and this rank's final
/// parameters (its part of them under configs/tp.toml's plan) within `param_tolerance`
/// of the reference's; prints the worst of each as "[ figures  ]" after `label`. The
/// pipeline's run goes to `run` when given.
void expect_pipeline_matches_reference(const parallax::Config& config,
                                       const std::string& label,
                                       double loss_tolerance = kFp32LossTolerance,
                                       double param_tolerance = kFp32ParameterTolerance,
                                       PipelineRun* run = nullptr);

}  // namespace equivalence
