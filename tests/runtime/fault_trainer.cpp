// A small trainer that fails on purpose, for tests/runtime/faults_test.sh: an MLP
// trained by the engine under any [parallel]/[zero]/[offload] config (fault_trainer.toml's
// batch), where rank R, at step S, does one thing:
//   --fault exception   throws (the trainer's own error: report_error tells the others)
//   --fault stop        raise(SIGSTOP): stalls, as a hung node does
//   --fault kill        raise(SIGKILL): dies, as a crashed node does
//   --fault disk-full   its file writes fail from then on (RLIMIT_FSIZE 0, SIGXFSZ
//                       ignored: each write fails with EFBIG), as on a full drive: the
//                       NVMe tier's next write, or the next checkpoint, fails mid-run
//   --fault evaluate    evaluates alone (a forward under NoGradGuard the others do not
//                       run), as a trainer that evaluates only on rank 0
// Just before, it writes the wall-clock time (seconds since the epoch) to --fault-time FILE,
// so the test measures the time from the fault to the job's end.
#include <sys/resource.h>
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <iomanip>

#include "parallax/runtime/parallax.h"

namespace {

struct Mlp : torch::nn::Module {
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

std::string value_of(const std::vector<std::string>& args, const std::string& flag) {
  for (std::size_t i = 1; i + 1 < args.size(); ++i) {
    if (args[i] == flag) return args[i + 1];
  }
  return "";
}

void inject(const std::string& fault, const std::string& time_file) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ofstream(time_file) << std::fixed << std::setprecision(3) << now << "\n";
  if (fault == "exception") throw std::runtime_error("fault_trainer: the injected exception");
  if (fault == "stop") std::raise(SIGSTOP);
  if (fault == "kill") std::raise(SIGKILL);
  if (fault == "disk-full") {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 0;
    setrlimit(RLIMIT_FSIZE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    parallax::InitOptions options;
    options.description = "Trains a small MLP and fails on purpose (tests/runtime/faults_test.sh).";
    options.flags = {{"--fault", "HOW", "exception, stop, kill, disk-full or evaluate"},
                     {"--fault-rank", "R", "the rank that fails"},
                     {"--fault-step", "S", "the step it fails at"},
                     {"--fault-time", "FILE", "where the fault's wall-clock time is written"}};
    auto rt = parallax::init(argc, argv, options);
    try {
      const std::string fault = value_of(rt.args(), "--fault");
      const int fault_rank = std::stoi(value_of(rt.args(), "--fault-rank"));
      const std::int64_t fault_step = std::stoll(value_of(rt.args(), "--fault-step"));
      torch::manual_seed(0);
      auto model = std::make_shared<Mlp>();
      auto engine = rt.engine(model, parallax::OptimizerSpec::from(rt.config()));
      const std::int64_t batch = rt.config().train.micro_batch_size;
      for (std::int64_t step = 0; step < rt.config().train.steps; ++step) {
        if (step == fault_step && rt.world().rank() == fault_rank) {
          inject(fault, value_of(rt.args(), "--fault-time"));
          if (fault == "evaluate") {
            torch::NoGradGuard no_grad;
            engine.forward(torch::randn({batch, 16}));
          }
        }
        for (std::int64_t micro = 0; micro < rt.config().train.grad_accum; ++micro) {
          const torch::Tensor x = torch::randn({batch, 16});
          engine.backward(torch::mse_loss(engine.forward(x), torch::sin(x.sum(1, true))));
        }
        engine.step();
      }
      return 0;
    } catch (const std::exception& error) {
      return parallax::report_error(error);  // while the runtime is alive, as train_gpt does
    }
  } catch (const std::exception& error) {
    return parallax::report_error(error);
  }
}
