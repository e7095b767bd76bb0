// Cells of the strategy matrix that compose the pipeline with other strategies, against
// the single-process reference: configs/3d.toml (tensor parallelism inside each
// pipeline stage by configs/tp.toml's plan, data parallelism across pipelines) on 4
// ranks (tp 2 × pp 2) and 8 ranks (tp 2 × pp 2 × dp 2), with and without sequence
// parallelism, tied embeddings across stages, and every schedule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpt_training.h"
#include "parallax/core/mpi_communicator.h"
#include "pipeline_training.h"

namespace {

struct Cell {
  std::string name;
  std::vector<std::string> overrides;
};

class MatrixEquivalence : public ::testing::TestWithParam<Cell> {};

TEST_P(MatrixEquivalence, MatchesTheSingleProcessReference) {
  const Cell& cell = GetParam();
  const int world = parallax::create_mpi_world_communicator()->size();
  if (world % 4 != 0) GTEST_SKIP() << "tp 2 × pp 2 needs a multiple of 4 ranks";
  std::vector<std::string> overrides{"model.n_layer=4"};
  overrides.insert(overrides.end(), cell.overrides.begin(), cell.overrides.end());
  const auto config = equivalence::make_config(4, overrides, "3d.toml");
  equivalence::expect_pipeline_matches_reference(config, cell.name + " on " + std::to_string(world) + " ranks");
}

const std::string kSequenceParallel = "tensor_parallel.sequence_parallel=true";
const std::string kTied = "model.tie_embeddings=true";

INSTANTIATE_TEST_SUITE_P(
    TensorParallelPipelines,
    MatrixEquivalence,
    ::testing::Values(Cell{"tp2_pp2", {}},
                      Cell{"tp2_pp2_sp_tied", {kSequenceParallel, kTied}},
                      Cell{"tp2_pp2_sp", {kSequenceParallel}},
                      Cell{"tp2_pp2_tied", {kTied}},
                      Cell{"tp2_pp2_gpipe", {"pipeline.schedule=\"gpipe\""}},
                      Cell{"tp2_pp2_interleaved",
                           {"pipeline.schedule=\"interleaved\"", "pipeline.virtual_stages=2", kSequenceParallel}},
                      Cell{"tp2_pp2_zb_h1_sp_tied", {"pipeline.schedule=\"zb-h1\"", kSequenceParallel, kTied}},
                      Cell{"tp2_pp2_recompute", {"pipeline.recompute=\"full\"", kSequenceParallel}}),
    [](const ::testing::TestParamInfo<Cell>& info) { return info.param.name; });

}  // namespace
