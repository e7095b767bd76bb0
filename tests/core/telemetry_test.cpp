// Metrics JSON lines and Chrome traces: the exact formats later tools read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

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
  m.model_state_bytes = {{16, 16, 32}, {16, 16, 32}};
  m.comm.resize(2);
  m.comm[1][CommOp::kAllReduce] = {2, 64, 0};
  const std::string line = to_json_line(m);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("\"step\":3,\"loss\":2.5,\"lr\":0.001,\"step_ms\":40,\"tokens_per_s\":1000"), std::string::npos)
      << line;
  EXPECT_NE(line.find("\"model_state_bytes\":[{\"params\":16,\"grads\":16,\"optimizer\":32,\"host\":0,\"nvme\":0},"),
            std::string::npos);
  EXPECT_NE(line.find("{\"all_reduce\":{\"calls\":0,\"bytes\":0}"), std::string::npos);
  EXPECT_NE(line.find("{\"all_reduce\":{\"calls\":2,\"bytes\":64},\"reduce_scatter\""), std::string::npos);
  for (const char* op : {"reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"}) {
    EXPECT_NE(line.find(std::string("\"") + op + "\":{\"calls\":"), std::string::npos) << op;
  }
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
