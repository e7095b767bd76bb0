// Trains the small GPT on the synthetic token stream with whatever strategy the config
// chooses. Usage:
//   mpirun -np 4 ./train_gpt --config configs/dp.toml [--set train.steps=50]...
//   mpirun -np 4 ./train_gpt --config configs/pp.toml [--print-schedule]
//   mpirun -np 8 ./train_gpt --config configs/3d.toml --explain
// With parallel.pp > 1 the model is given as layer specs to a PipelineEngine;
// --print-schedule prints the schedule's timeline on rank 0 and exits. --explain prints
// the plan (every rank's coordinates, node, cores, device and groups), runs one step and
// prints each rank's model-state bytes beside ZeRO's formulas and the bytes each of its
// groups moved, then exits.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "gpt.h"
#include "parallax/runtime/parallax.h"

namespace {

bool has_flag(const parallax::Runtime& rt, const std::string& flag) {
  for (const std::string& arg : rt.args()) {
    if (arg == flag) return true;
  }
  return false;
}

template <typename EngineType>
void print_summary(parallax::Runtime& rt,
                   const EngineType& engine,
                   std::int64_t steps,
                   double seconds,
                   double first_loss,
                   double total_ms) {
  const auto& train = rt.config().train;
  const double last_loss = engine.last_loss();
  if (engine.preempted()) {
    rt.logger().summary("preempted: stopped after step ", engine.global_step(), " of ", train.steps,
                        " (saved; checkpoint.load = \"latest\" resumes)");
  }
  const auto& degrees = rt.mesh().degrees();
  if (steps == 0) {
    rt.logger().summary("done: nothing to train (resumed at or past train.steps = ", train.steps, ")");
    return;
  }
  const auto block_size = rt.config().app_table("model").get_int("block_size", 32);
  char line[256];
  std::snprintf(line, sizeof(line),
                "done: %lld steps in %.1f s | loss %.4f -> %.4f | %.1f ms/step | %.0f tok/s | %d ranks (tp=%d, pp=%d, "
                "dp=%d)",
                static_cast<long long>(steps), seconds, first_loss, last_loss,
                total_ms / static_cast<double>(std::max<std::int64_t>(steps, 1)),
                static_cast<double>(steps * train.global_batch_size * block_size) / seconds, rt.world().size(),
                degrees.tp, degrees.pp, degrees.dp);
  rt.logger().summary(line);
}

// --explain: init has printed the plan (rt.explain()); one optimizer step (`step()`)
// measured, then exit.
template <typename EngineType, typename Step>
int explain(parallax::Runtime& rt, EngineType& engine, Step step) {
  parallax::GroupTraffic traffic(rt);
  step();
  rt.logger().summary(
      traffic.report(rt, engine.model_state_bytes(), engine.gradient_bytes() / 4, engine.gradient_padding_bytes() / 4));
  return 0;
}

// The same model as layer specs, over pipeline stages.
int train_pipeline(parallax::Runtime& rt) {
  const parallax::Config& config = rt.config();
  const auto options = gpt::GPTOptions::from_table(config.app_table("model"));
  const auto data = config.app.count("data")
                        ? gpt::SyntheticTokens::from_table(config.app_table("data"), options, config.train.seed)
                        : gpt::SyntheticTokens(options.vocab_size, options.block_size, config.train.seed);
  const auto& train = config.train;
  const int dp_rank = rt.mesh().coord().dp;
  const int dp = rt.mesh().degrees().dp;
  auto micro_batch = [&](std::int64_t step, std::int64_t micro) {
    auto [inputs, targets] = data.batch(
        gpt::first_sample(step, micro, dp_rank, dp, train.micro_batch_size, train.grad_accum), train.micro_batch_size);
    return parallax::pipeline::MicroBatch{{inputs}, {targets}};
  };
  parallax::PipelineEngineOptions engine_options;
  engine_options.profile_batch = micro_batch(0, 0);
  // The built-in loss is vocabulary-parallel when a plan leaves the logits split.
  parallax::PipelineEngine engine(rt, gpt::layer_specs(options), parallax::CrossEntropyLoss{},
                                  parallax::OptimizerSpec::from(config), engine_options);
  if (has_flag(rt, "--print-schedule")) {
    rt.logger().summary(engine.timeline());
    return 0;
  }
  engine.set_tokens_per_sample(options.block_size);
  if (has_flag(rt, "--explain")) {
    return explain(rt, engine, [&] {
      std::int64_t micro = 0;
      engine.train_batch([&] { return micro_batch(0, micro++); });
    });
  }
  // [checkpoint]: resume where checkpoint.load says (the data's position is the step).
  engine.resume();
  const std::int64_t first_step = engine.global_step();
  double first_loss = 0.0;
  double total_ms = 0.0;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = first_step; step < train.steps; ++step) {
    std::int64_t micro = 0;
    const double loss = engine.train_batch([&] { return micro_batch(step, micro++); });
    if (step == first_step) first_loss = loss;
    total_ms += engine.last_metrics().step_ms;
    if (engine.preempted()) break;  // saved: stop, exit 0
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  engine.finish();  // [checkpoint]: the final save (unless just saved) and export_on_finish
  print_summary(rt, engine, engine.global_step() - first_step, seconds, first_loss, total_ms);
  return 0;
}

int train(parallax::Runtime& rt) {
  if (rt.config().parallel.pp > 1) return train_pipeline(rt);
  const parallax::Config& config = rt.config();
  // At ZeRO stage 3 the model is built without any rank ever holding all of it.
  auto [model_options, data, model] = gpt::build_example(config);
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(config));
  engine.set_tokens_per_sample(model_options.block_size);

  const auto& train = config.train;
  const int dp_rank = rt.mesh().coord().dp;
  const int dp = rt.mesh().degrees().dp;
  auto optimizer_step = [&, &data = data](std::int64_t step) {
    for (std::int64_t micro = 0; micro < train.grad_accum; ++micro) {
      auto [whole_inputs, whole_targets] =
          data.batch(gpt::first_sample(step, micro, dp_rank, dp, train.micro_batch_size, train.grad_accum),
                     train.micro_batch_size);
      // With cp > 1, this rank's positions of each sequence (and of its targets).
      const torch::Tensor inputs = engine.local_sequence(whole_inputs), targets = engine.local_sequence(whole_targets);
      // engine.cross_entropy: the vocab-parallel loss when a plan splits the logits.
      auto loss = engine.cross_entropy(engine.forward(inputs), targets);
      engine.backward(loss);
      engine.step();
    }
  };
  if (has_flag(rt, "--explain")) return explain(rt, engine, [&] { optimizer_step(0); });
  // [checkpoint]: resume where checkpoint.load says (the data's position is the step).
  engine.resume();
  const std::int64_t first_step = engine.global_step();
  double first_loss = 0.0;
  double total_ms = 0.0;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = first_step; step < train.steps; ++step) {
    optimizer_step(step);
    if (step == first_step) first_loss = engine.last_loss();
    total_ms += engine.last_metrics().step_ms;
    if (engine.preempted()) break;  // saved: stop, exit 0
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  engine.finish();  // [checkpoint]: the final save (unless just saved) and export_on_finish
  print_summary(rt, engine, engine.global_step() - first_step, seconds, first_loss, total_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    parallax::InitOptions options;
    options.app_tables = {"model", "data"};
    options.description = "Trains a small GPT on a synthetic token stream with the strategy the config chooses.";
    options.flags = {{"--print-schedule", "", "With parallel.pp > 1: print the pipeline schedule's timeline and exit."},
                     {"--explain", "", "Print the plan, run one step, print each rank's memory and traffic; exit."}};
    auto rt = parallax::init(argc, argv, options);
    try {
      return train(rt);
    } catch (const std::exception& error) {
      // Reported while the runtime is alive: its shutdown then waits (bounded) for the
      // other ranks, so they too can report before the job ends.
      return parallax::report_error(error);
    }
  } catch (const std::exception& error) {
    return parallax::report_error(error);
  }
}
