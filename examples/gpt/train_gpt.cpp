// Trains the small GPT on the synthetic token stream with whatever strategy the config
// chooses. Usage:
//   mpirun -np 4 ./train_gpt --config configs/dp.toml [--set train.steps=50]...
#include <chrono>
#include <cstdio>

#include "gpt.h"
#include "parallax/runtime/parallax.h"

namespace {

int train(parallax::Runtime& rt) {
  const parallax::Config& config = rt.config();
  // At ZeRO stage 3 the model is built without any rank ever holding all of it.
  auto [model_options, data, model] = gpt::build_example(config);
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(config));
  engine.set_tokens_per_sample(model_options.block_size);

  const auto& train = config.train;
  const int dp_rank = rt.mesh().coord().dp;
  const int dp = rt.mesh().degrees().dp;
  double first_loss = 0.0;
  double total_ms = 0.0;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < train.steps; ++step) {
    for (std::int64_t micro = 0; micro < train.grad_accum; ++micro) {
      auto [inputs, targets] =
          data.batch(gpt::first_sample(step, micro, dp_rank, dp, train.micro_batch_size, train.grad_accum),
                     train.micro_batch_size);
      // engine.cross_entropy: the vocab-parallel loss when a plan splits the logits.
      auto loss = engine.cross_entropy(engine.forward(inputs), targets);
      engine.backward(loss);
      engine.step();
    }
    if (step == 0) first_loss = engine.last_loss();
    total_ms += engine.last_metrics().step_ms;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char line[256];
  std::snprintf(line, sizeof(line),
                "done: %lld steps in %.1f s | loss %.4f -> %.4f | %.1f ms/step | %.0f tok/s | %d ranks (tp=%d, dp=%d)",
                static_cast<long long>(train.steps), seconds, first_loss, engine.last_loss(),
                total_ms / static_cast<double>(train.steps),
                static_cast<double>(train.steps * train.global_batch_size * model_options.block_size) / seconds,
                rt.world().size(), rt.mesh().degrees().tp, dp);
  rt.logger().summary(line);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto rt = parallax::init(argc, argv, {{"model", "data"}});
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
