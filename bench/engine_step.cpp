// bench_engine_step: the cost of the engine around one training step, against a plain
// LibTorch step of the same model and batch, in the same run (Google Benchmark).
//
// Plain: forward, loss, zero_grad, backward, global-norm clip, AdamW step.
// Parallax: the same through the engine on a world of one (buckets, hooks, the
// telemetry exchange and metrics bookkeeping, but no peer to wait for), so the ratio is
// the engine's own overhead. Communication is measured by bench_allreduce.
//
//   ./bench/bench_engine_step [--benchmark_min_time=2] [--d_model=128]
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>

#include "gpt.h"
#include "parallax/core/config_loader.h"
#include "parallax/runtime/parallax.h"

namespace {

constexpr std::int64_t kBatch = 16;

gpt::GPTOptions model_options() {
  gpt::GPTOptions o;
  o.vocab_size = 256;
  o.block_size = 64;
  o.d_model = 128;
  o.n_layer = 2;
  o.n_head = 4;
  return o;
}

parallax::Runtime* g_runtime = nullptr;  // set by main(): benchmarks run inside one runtime

void BM_PlainLibTorchStep(benchmark::State& state) {
  const auto options = model_options();
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, 1);
  gpt::GPT model(options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  std::int64_t step = 0;
  for (auto _ : state) {
    auto [inputs, targets] = data.batch(step++ * kBatch, kBatch);
    auto loss = gpt::language_model_loss(model->forward(inputs), targets);
    optimizer.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
  }
  state.SetItemsProcessed(state.iterations() * kBatch * options.block_size);
}

void BM_ParallaxEngineStep(benchmark::State& state) {
  const auto options = model_options();
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, 1);
  gpt::GPT model(options);
  auto engine = g_runtime->engine(model, parallax::OptimizerSpec::from(g_runtime->config()));
  std::int64_t step = 0;
  for (auto _ : state) {
    auto [inputs, targets] = data.batch(step++ * kBatch, kBatch);
    engine.backward(gpt::language_model_loss(engine.forward(inputs), targets));
    engine.step();
  }
  state.SetItemsProcessed(state.iterations() * kBatch * options.block_size);
}

BENCHMARK(BM_PlainLibTorchStep)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ParallaxEngineStep)->Unit(benchmark::kMillisecond);

// Prints the usual table, then the ratio against the baseline measured in this run.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) seconds_[run.benchmark_name()] = run.GetAdjustedRealTime();
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const auto plain = seconds_.find("BM_PlainLibTorchStep");
    const auto engine = seconds_.find("BM_ParallaxEngineStep");
    if (plain != seconds_.end() && engine != seconds_.end() && plain->second > 0) {
      std::printf("engine step / plain LibTorch step = %.3f (%.2f ms vs %.2f ms)\n", engine->second / plain->second,
                  engine->second, plain->second);
    }
  }

 private:
  std::map<std::string, double> seconds_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  parallax::ConfigSources sources;
  sources.overrides = {"train.global_batch_size=16", "train.grad_accum=1",      "optimizer.type=\"adamw\"",
                       "optimizer.lr=1e-3",          "optimizer.grad_clip=1.0", "logging.every=0"};
  parallax::Runtime runtime(parallax::load_config(sources), {{}, /*print_summary=*/false});
  g_runtime = &runtime;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
