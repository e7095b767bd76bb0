// Metrics JSON lines, TensorBoard scalars and Chrome traces: the exact formats later
// tools read (the event file's framing: tensorboard_writer_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/core/metrics.h"
#include "parallax/core/trace.h"

namespace parallax {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(Metrics, JsonLineHasTheContractFieldsIndexedByRank) {
  StepMetrics m;
  m.step = 3;
  m.loss = 2.5;
  m.lr = 0.001;
  m.step_ms = 40;
  m.tokens_per_s = 1000;
  m.samples_per_s = 125;
  m.model_state_bytes = {{16, 16, 32}, {16, 16, 32}};
  m.comm.resize(2);
  m.comm[1][CommOp::kAllReduce] = {2, 64, 0, 16};
  const std::string line = to_json_line(m);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(
      line.find("\"step\":3,\"loss\":2.5,\"lr\":0.001,\"step_ms\":40,\"tokens_per_s\":1000,\"samples_per_s\":125,"),
      std::string::npos)
      << line;
  EXPECT_NE(line.find("\"model_state_bytes\":[{\"params\":16,\"grads\":16,\"optimizer\":32,\"host\":0,\"nvme\":0},"),
            std::string::npos);
  EXPECT_NE(line.find("{\"all_reduce\":{\"calls\":0,\"bytes\":0,\"inter_node_bytes\":0}"), std::string::npos);
  EXPECT_NE(line.find("{\"all_reduce\":{\"calls\":2,\"bytes\":64,\"inter_node_bytes\":16},\"reduce_scatter\""),
            std::string::npos);
  for (const char* op : {"reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"}) {
    EXPECT_NE(line.find(std::string("\"") + op + "\":{\"calls\":"), std::string::npos) << op;
  }
}

TEST(Metrics, PeakMemoryByRankWhereMeasured) {
  StepMetrics m;
  EXPECT_EQ(to_json_line(m).find("peak_memory"), std::string::npos);
  m.model_state_bytes = {{1, 2, 3}, {1, 2, 3}};
  m.peak_memory = {{4096, 1 << 20}, {-1, 2 << 20}};
  const std::string line = to_json_line(m);
  EXPECT_NE(line.find(",\"peak_memory\":[{\"allocated\":4096,\"resident\":1048576},{\"allocated\":-1,"
                      "\"resident\":2097152}],\"comm\""),
            std::string::npos)
      << line;
  std::vector<std::pair<std::string, double>> memory;
  for (const TensorBoardScalar& s : tensorboard_scalars(m)) {
    if (s.tag.rfind("memory/", 0) == 0) memory.emplace_back(s.tag, s.value);
  }
  const std::vector<std::pair<std::string, double>> want = {{"memory/rank0_bytes", 6},
                                                            {"memory/rank0_peak_allocated_bytes", 4096},
                                                            {"memory/rank0_peak_resident_bytes", 1 << 20},
                                                            {"memory/rank1_bytes", 6},
                                                            {"memory/rank1_peak_resident_bytes", 2 << 20}};
  EXPECT_EQ(memory, want);
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(12900000), "12.3 MiB");
  EXPECT_EQ(human_bytes(std::int64_t{1300} << 20), "1.27 GiB");
  EXPECT_EQ(human_bytes(-1), "?");
}

TEST(Metrics, BubbleFractionsOnlyForPipelines) {
  StepMetrics m;
  EXPECT_EQ(to_json_line(m).find("bubble_fraction"), std::string::npos);
  m.bubble_fraction = {0.25, 0.5};
  const std::string line = to_json_line(m);
  EXPECT_NE(line.find(",\"bubble_fraction\":[0.25,0.5]}"), std::string::npos) << line;
}

TEST(Metrics, DivergedLossIsWrittenAsNull) {
  StepMetrics m;
  m.loss = std::nan("");
  EXPECT_NE(to_json_line(m).find("\"loss\":null"), std::string::npos);
}

TEST(Metrics, WriterAppendsOneLinePerStepAndNamesBadPaths) {
  const auto path = (std::filesystem::temp_directory_path() / "parallax_metrics_test.jsonl").string();
  {
    MetricsWriter writer(path);
    StepMetrics m;
    m.step = 1;
    writer.write(m);
    m.step = 2;
    writer.write(m);
  }
  const std::string text = read_file(path);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  EXPECT_NE(text.find("{\"step\":2,"), std::string::npos);
  std::filesystem::remove(path);
  try {
    MetricsWriter bad("/no/such/dir/metrics.jsonl");
    FAIL() << "expected an error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/dir/metrics.jsonl"), std::string::npos);
  }
}

// Mutants this catches: a rank's memory not summed over its five kinds, comm bytes taken
// from one rank instead of summed, grad_norm written when not computed, tokens/s written
// for a trainer that never set tokens per sample.
TEST(Metrics, TensorBoardScalarsNameEveryValueOncePerStep) {
  StepMetrics m;
  m.step = 5;
  m.loss = 2.5;
  m.lr = 0.001;
  m.step_ms = 40;
  m.samples_per_s = 200;
  m.tokens_per_s = 200;
  m.model_state_bytes = {{16, 16, 32, 8, 4}, {1, 2, 3, 0, 0}};
  m.comm.resize(2);
  m.comm[0][CommOp::kAllReduce] = {2, 64, 0, 64};
  m.comm[1][CommOp::kAllReduce] = {2, 32, 0, 32};
  m.comm[1][CommOp::kSend] = {1, 8, 0, 0};
  m.comm[1][CommOp::kRecv] = {1, 8, 0, 8};  // the sender's bytes: not in the node split
  std::vector<std::pair<std::string, double>> got;
  for (const TensorBoardScalar& s : tensorboard_scalars(m)) got.emplace_back(s.tag, s.value);
  const std::vector<std::pair<std::string, double>> want = {
      {"train/loss", 2.5},           {"train/lr", 0.001},
      {"perf/step_ms", 40},          {"perf/samples_per_s", 200},
      {"memory/rank0_bytes", 76},    {"memory/rank1_bytes", 6},
      {"comm/all_reduce_bytes", 96}, {"comm/reduce_scatter_bytes", 0},
      {"comm/all_gather_bytes", 0},  {"comm/broadcast_bytes", 0},
      {"comm/send_bytes", 8},        {"comm/recv_bytes", 8},
      {"comm/barrier_bytes", 0},     {"comm/all_to_all_bytes", 0},
      {"comm/intra_node_bytes", 8},  {"comm/inter_node_bytes", 96}};
  EXPECT_EQ(got, want);

  m.grad_norm = 1.5;
  m.tokens_per_sample = 64;
  m.tokens_per_s = 12800;
  m.bubble_fraction = {0.25, 0.5};
  got.clear();
  for (const TensorBoardScalar& s : tensorboard_scalars(m)) got.emplace_back(s.tag, s.value);
  ASSERT_EQ(got.size(), want.size() + 4);
  EXPECT_EQ(got[2], (std::pair<std::string, double>{"train/grad_norm", 1.5}));
  EXPECT_EQ(got[5], (std::pair<std::string, double>{"perf/tokens_per_s", 12800}));
  EXPECT_EQ(got[got.size() - 1], (std::pair<std::string, double>{"pipeline/rank1_bubble_fraction", 0.5}));

  // A model with MoE layers: the routing, last.
  m.moe.layers = 2;
  m.moe.aux_loss = 0.02;
  m.moe.imbalance = 1.25;
  got.clear();
  for (const TensorBoardScalar& s : tensorboard_scalars(m)) got.emplace_back(s.tag, s.value);
  ASSERT_EQ(got.size(), want.size() + 4 + 5);
  EXPECT_EQ(got[want.size() + 4], (std::pair<std::string, double>{"moe/aux_loss", 0.02}));
  EXPECT_EQ(got.back(), (std::pair<std::string, double>{"moe/imbalance", 1.25}));
  EXPECT_NE(to_json_line(m).find("\"moe\":{\"layers\":2,\"aux_loss\":0.02"), std::string::npos) << to_json_line(m);
}

TEST(Metrics, HumanDurationForTheEta) {
  EXPECT_EQ(human_duration(0), "0s");
  EXPECT_EQ(human_duration(45.4), "45s");
  EXPECT_EQ(human_duration(59.6), "1m00s");
  EXPECT_EQ(human_duration(83), "1m23s");
  EXPECT_EQ(human_duration(3599.4), "59m59s");
  EXPECT_EQ(human_duration(3599.6), "1h00m");
  EXPECT_EQ(human_duration(7500), "2h05m");
  EXPECT_EQ(human_duration(7199), "2h00m");
  EXPECT_EQ(human_duration(180000), "50h00m");
  EXPECT_EQ(human_duration(-1), "?");
  EXPECT_EQ(human_duration(std::nan("")), "?");
}

// A sink that fails is closed and named; the other keeps writing (a full disk under the
// JSON file must not silence TensorBoard, nor stop training).
TEST(Metrics, WriterClosesAFailedSinkAndKeepsTheOther) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full to fail writes";
  const auto dir = std::filesystem::temp_directory_path() / "parallax_metrics_sinks_test";
  std::filesystem::remove_all(dir);
  {
    MetricsWriter writer("/dev/full", dir.string());
    StepMetrics m;
    m.step = 1;
    try {
      writer.write(m);
      FAIL() << "expected the JSON sink to fail";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("logging.metrics_file '/dev/full'"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(writer.open());
    m.step = 2;
    EXPECT_NO_THROW(writer.write(m));
  }
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    // Three records: file_version, steps 1 and 2 (each a few dozen bytes).
    EXPECT_GT(std::filesystem::file_size(entry.path()), 3u * 16u);
  }
  EXPECT_EQ(files, 1u);
  std::filesystem::remove_all(dir);
}

TEST(Trace, PerRankPathsInsertTheRankBeforeTheExtension) {
  EXPECT_EQ(Tracer::per_rank_path("out/trace.json", 3), "out/trace.rank3.json");
  EXPECT_EQ(Tracer::per_rank_path("trace", 0), "trace.rank0");
  EXPECT_EQ(Tracer::per_rank_path("run.d/trace", 1), "run.d/trace.rank1");
}

TEST(Trace, SpansAreWrittenAsChromeCompleteEvents) {
  Tracer tracer(true);
  { auto span = tracer.span("forward", "compute"); }
  tracer.record("all_reduce", "comm", 10, 5);
  EXPECT_EQ(tracer.size(), 2u);
  const auto path = (std::filesystem::temp_directory_path() / "parallax_trace_test.json").string();
  tracer.write(path, 7);
  const std::string text = read_file(path);
  EXPECT_EQ(text.rfind("{\"traceEvents\":[", 0), 0u);
  EXPECT_NE(text.find("\"name\":\"forward\",\"cat\":\"compute\",\"ph\":\"X\""), std::string::npos);
  EXPECT_NE(text.find("\"ts\":10,\"dur\":5,\"pid\":7"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(Trace, DisabledTracerRecordsNothing) {
  Tracer tracer(false);
  { auto span = tracer.span("forward", "compute"); }
  tracer.record("x", "y", 0, 1);
  EXPECT_EQ(tracer.size(), 0u);
}

}  // namespace
}  // namespace parallax
