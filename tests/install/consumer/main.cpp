// The installed-package consumer: a tiny trainer built outside the Parallax tree against
// `find_package(Parallax)`. Fits a torch::nn::Linear to y = 2·sum(x) - 1 on one fixed
// batch for train.steps steps with the engine and prints each step's loss on rank 0.
//
//   mpirun -np 2 ./consumer --config tiny.toml
#include <torch/torch.h>

#include <parallax/runtime/parallax.h>

int main(int argc, char** argv) try {
  auto rt = parallax::init(argc, argv);
  torch::manual_seed(0);
  auto model = torch::nn::Linear(4, 1);
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(rt.config()));
  const auto& train = rt.config().train;
  const auto x = torch::randn({train.micro_batch_size, 4});
  const auto y = 2 * x.sum(1, true) - 1;
  for (std::int64_t step = 0; step < train.steps; ++step) {
    for (std::int64_t micro = 0; micro < engine.grad_accum(); ++micro) {
      auto loss = torch::mse_loss(engine.forward(x), y);
      engine.backward(loss);
      engine.step();
    }
    rt.logger().summary("consumer step ", step, " loss ", engine.last_loss());
  }
  return 0;
} catch (const std::exception& e) {
  return parallax::report_error(e);
}
