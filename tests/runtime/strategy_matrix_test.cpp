// The strategy matrix (planner/strategy_matrix.h): each refused combination names its
// keys with their file positions, the reason and the nearest cell that runs; the
// shipped configs run; and the README's table is the one the code prints.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/planner/strategy_matrix.h"

namespace {

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

namespace fs = std::filesystem;

// A config file written to a temporary directory, loaded and resolved on `world` ranks.
parallax::Config resolved(const std::string& toml, int world, std::string* path = nullptr) {
  const fs::path file = fs::temp_directory_path() / ("strategy_matrix_test_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(file) << "[train]\nmicro_batch_size = 1\n" << toml;
  parallax::Config config = parallax::load_config({{file.string()}, {}});
  config.resolve(world);
  if (path != nullptr) *path = file.string();
  fs::remove(file);
  return config;
}

std::string refusal_of(const parallax::Config& config) {
  try {
    parallax::check_strategy(config);
  } catch (const parallax::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "the strategy was accepted";
  return "";
}

// Every product of tp, pp, dp and ZeRO 1–3 runs, with offload where ZeRO allows it.
TEST(StrategyMatrix, ZeroInsidePipelineStagesRuns) {
  for (int stage = 1; stage <= 3; ++stage) {
    const auto config = resolved("[parallel]\ntp = 2\npp = 2\n[zero]\nstage = " + std::to_string(stage) +
                                     "\n[offload]\noptimizer = \"cpu\"\n[tensor_parallel.plan]\n\"*\" = \"column\"\n",
                                 8);
    EXPECT_TRUE(parallax::strategy_refusals(config).empty()) << "zero.stage = " << stage;
  }
}

// Split logits under a pipeline are the engine's question (it depends on the loss the
// trainer passes: matrix_equivalence_test), not the matrix's.
TEST(StrategyMatrix, SplitLogitsUnderAPipelineRun) {
  const auto config = resolved(
      "[parallel]\ntp = 2\npp = 2\n[tensor_parallel.plan]\n\"*\" = \"column\"\n\"head\" = \"vocab_output\"\n", 8);
  EXPECT_TRUE(parallax::strategy_refusals(config).empty());
}

TEST(StrategyMatrix, EveryRefusalIsListed) {
  const auto config = resolved(
      "[parallel]\nmode = \"auto\"\ntp = 2\n[tensor_parallel]\nsequence_parallel = true\n[comm]\nbackend = \"nccl\"\n",
      2);
  // parallel.mode = "auto" is not refused: parallax::init plans it before this check.
  const auto refusals = parallax::strategy_refusals(config);
  ASSERT_EQ(refusals.size(), 2u);
  const std::string error = refusal_of(config);
  EXPECT_CONTAINS(error, "comm.backend = \"nccl\" at ");
  EXPECT_CONTAINS(error, "NCCL cannot carry");
  EXPECT_CONTAINS(error, "train.device = \"cpu\"");
  EXPECT_CONTAINS(error, "\n  - tensor_parallel.sequence_parallel = true at ");
}

// The lines continue the file's [train] table (see resolved()).
TEST(StrategyMatrix, CudaTrainingTakesNcclForCudaTensorsAndNoPipelineYet) {
  EXPECT_TRUE(parallax::strategy_refusals(resolved("device = \"cuda\"\n[parallel]\ntp = 2\n", 4)).empty());
  EXPECT_TRUE(
      parallax::strategy_refusals(resolved("device = \"cuda\"\n[comm]\nbackend = \"nccl\"\n[zero]\nstage = 3\n", 2))
          .empty());
  EXPECT_CONTAINS(refusal_of(resolved("device = \"cuda\"\n[comm]\nbackend = \"mpi\"\n", 2)),
                  "carries host memory only");
  EXPECT_CONTAINS(refusal_of(resolved("device = \"cuda\"\n[parallel]\npp = 2\n", 2)),
                  "pipeline stages on GPUs are not in this build yet");
}

TEST(StrategyMatrix, SequenceParallelismNeedsAPlan) {
  const auto config = resolved("[parallel]\ntp = 2\n[tensor_parallel]\nsequence_parallel = true\n", 2);
  EXPECT_CONTAINS(refusal_of(config), "only a [tensor_parallel.plan] splits the sequence");
}

TEST(StrategyMatrix, ShippedConfigsRun) {
  const std::string dir = PARALLAX_SOURCE_DIR "/configs/";
  for (const auto& [file, world] : std::vector<std::pair<std::string, int>>{{"gpt_base.toml", 4},
                                                                            {"dp.toml", 4},
                                                                            {"bf16.toml", 4},
                                                                            {"offload.toml", 4},
                                                                            {"tp.toml", 4},
                                                                            {"pp.toml", 4},
                                                                            {"3d.toml", 8},
                                                                            {"3d.toml", 4}}) {
    parallax::Config config = parallax::load_config({{dir + file}, {}}, {{"model", "data"}});
    config.resolve(world);
    EXPECT_TRUE(parallax::strategy_refusals(config).empty()) << file << " on " << world << " ranks";
  }
}

// The README holds the table between its markers exactly as the code prints it.
TEST(StrategyMatrix, ReadmeTableIsTheGeneratedOne) {
  std::ifstream in(PARALLAX_SOURCE_DIR "/README.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const std::string begin = "<!-- strategy-matrix:begin (generated by build/runtime/parallax-matrix) -->\n";
  const std::string end = "<!-- strategy-matrix:end -->";
  const auto from = readme.find(begin);
  const auto to = readme.find(end);
  ASSERT_NE(from, std::string::npos) << "README.md has no strategy-matrix markers";
  ASSERT_NE(to, std::string::npos);
  const std::string table = readme.substr(from + begin.size(), to - from - begin.size());
  const std::string generated = parallax::strategy_matrix_markdown();
  EXPECT_EQ(table, generated) << "regenerate it: build/runtime/parallax-matrix";
  // Both kinds of cell are there.
  EXPECT_CONTAINS(generated, "| 2 | 2 | 1 | 2 | 0 | runs | refused (1) | refused (1) |");
  EXPECT_CONTAINS(generated, "| 2 | 2 | 1 | 2 | 3 | runs | runs | runs |");
  EXPECT_CONTAINS(generated, "| 1 | 1 | 2 | 1 | 2 | runs | runs | refused (2) |");
  EXPECT_CONTAINS(generated, "2. only zero.stage = 3 shards the parameters");
}

}  // namespace
