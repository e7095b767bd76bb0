// bench_zero_step: step time, peak resident memory, model-state bytes per rank and the
// tensor-parallel group's traffic of the GPT example under the configured strategy, as
// one JSON line on rank 0. bench/zero.sh runs it once per ZeRO stage (one mpirun each,
// so peak RSS belongs to one configuration) next to the PyTorch peers in
// bench/peers/torch_zero.py, which print the same line; bench/tp.sh once per tp degree.
//
//   mpirun -np 4 build/bench/bench_zero_step --config configs/gpt_base.toml
//       --set zero.stage=1 --set train.steps=12 --set logging.every=0
//
// The loop is train_gpt's: `train.steps` optimizer steps of `grad_accum` micro-steps on
// the synthetic token stream. A step's time is the wall time from its first forward to
// the return of the engine's step() (the batch is made before the clock starts); per
// step the slowest rank counts, the first 2 steps are warm-up, and the median of the
// rest is reported. Peak RSS is getrusage's ru_maxrss (KiB on Linux) after training.
//
// Output (one line; model_state_bytes are the device side, host_bytes and nvme_bytes what
// [offload] moved off it):
//   {"impl": "parallax", "zero_stage": 0, "offload": "none/none", "ranks": 4,
//    "median_step_ms": 9.1, "peak_rss_mib": [412.3, ...], "model_state_bytes": [1234567, ...],
//    "host_bytes": [0, ...], "nvme_bytes": [0, ...], "comm_bytes_per_step": [884736, ...],
//    "comm_calls_per_step": [6.0, ...], "tp": 1, "sequence_parallel": false,
//    "tp_payload_per_step": {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0},
//    "final_loss": 2.1}
// comm_bytes_per_step / comm_calls_per_step: per rank, the mean over the timed steps of
// the training groups' collectives (the engine's counters: an all-reduce or broadcast
// counts its tensor, an all-gather or reduce-scatter the full buffer, a send its message;
// the metrics' all-gather is not training traffic and is not counted).
// tp_payload_per_step: rank 0's tensor-parallel group, payload bytes per optimizer step
// by collective (an all-reduce's tensor, an all-gather's output, a reduce-scatter's input),
// the same every step.
// "losses": every optimizer step's loss (the mean over the global batch), "final_loss"
// the last of them.
//
// --write-initial-weights PATH: rank 0 first writes the model's initial parameters, by
// name, with torch::pickle_save (Python reads them with torch.load), so a PyTorch peer
// can start from exactly these weights (bench/peers/torch_zero.py --initial-weights).
#include <sys/resource.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gpt.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/mesh.h"
#include "parallax/runtime/parallax.h"
#include "parallax/zero/deferred_construction.h"

namespace {

constexpr std::int64_t kWarmupSteps = 2;

// Peak resident set size of this process in MiB (ru_maxrss is in KiB on Linux).
double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// Every rank's `local` (same length on all ranks), concatenated in rank order.
torch::Tensor gather(parallax::Communicator& comm, const torch::Tensor& local) {
  auto input = local.contiguous();
  auto output = torch::empty({comm.size() * input.numel()}, input.options());
  comm.all_gather(output, input)->wait();
  return output.view({comm.size(), input.numel()});
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string json_list(const torch::Tensor& values, const char* format) {
  std::string out = "[";
  char item[64];
  for (std::int64_t i = 0; i < values.numel(); ++i) {
    std::snprintf(item, sizeof(item), format, values[i].item<double>());
    out += (i > 0 ? ", " : "") + std::string(item);
  }
  return out + "]";
}

// The value of `--write-initial-weights PATH` among the application's arguments (init
// has refused any other flag, and this one without its value), or "".
std::string initial_weights_path(const std::vector<std::string>& args) {
  for (std::size_t i = 1; i + 1 < args.size(); ++i) {
    if (args[i] == "--write-initial-weights") return args[i + 1];
  }
  return "";
}

// The model's parameters as ((name, tensor), ...), a file torch.load reads (tuples, not a
// typed Dict, whose type tag torch.load's weights_only default refuses).
void write_initial_weights(torch::nn::Module& model, const std::string& path) {
  std::vector<c10::IValue> weights;
  for (const auto& item : model.named_parameters()) {
    PARALLAX_CHECK(!parallax::zero::is_deferred(item.value()), UsageError,
                   "--write-initial-weights: the model is built deferred (zero.stage = 3); write them from a run at "
                   "a lower stage");
    weights.emplace_back(c10::ivalue::Tuple::create({item.key(), item.value().detach().clone()}));
  }
  const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(std::move(weights)));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  PARALLAX_CHECK(out.good(), UsageError, "--write-initial-weights ", path, ": cannot write the file");
}

int run(parallax::Runtime& rt) {
  const parallax::Config& config = rt.config();
  const auto& train = config.train;
  PARALLAX_CHECK(train.steps > kWarmupSteps, ConfigError, "train.steps = ", train.steps, ": bench_zero_step drops ",
                 kWarmupSteps, " warm-up steps, so it needs at least ", kWarmupSteps + 1);
  // At ZeRO stage 3 the model is built without any rank ever holding all of it.
  auto [model_options, data, model] = gpt::build_example(config);
  const std::string weights_path = initial_weights_path(rt.args());
  if (!weights_path.empty() && rt.world().rank() == 0) write_initial_weights(*model, weights_path);
  auto engine = rt.engine(model, parallax::OptimizerSpec::from(config));
  engine.set_tokens_per_sample(model_options.block_size);

  const int dp_rank = rt.mesh().coord().dp;
  const int dp = rt.mesh().degrees().dp;
  std::vector<double> step_ms(static_cast<std::size_t>(train.steps));
  std::vector<double> losses;
  parallax::CommCounters tp_before_timed;
  double comm_bytes = 0.0;  // this rank's training collectives over the timed steps (the engine's counters)
  double comm_calls = 0.0;
  for (std::int64_t step = 0; step < train.steps; ++step) {
    if (step == kWarmupSteps) tp_before_timed = rt.mesh().tp().counters();
    std::vector<std::pair<torch::Tensor, torch::Tensor>> micro_batches;
    for (std::int64_t micro = 0; micro < train.grad_accum; ++micro) {
      micro_batches.push_back(
          data.batch(gpt::first_sample(step, micro, dp_rank, dp, train.micro_batch_size, train.grad_accum),
                     train.micro_batch_size));
    }
    const auto start = std::chrono::steady_clock::now();
    for (const auto& [inputs, targets] : micro_batches) {
      engine.backward(engine.cross_entropy(engine.forward(inputs), targets));
      engine.step();
    }
    step_ms[static_cast<std::size_t>(step)] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    losses.push_back(engine.last_loss());
    if (step >= kWarmupSteps) {
      for (const auto& op : engine.last_metrics().comm.at(static_cast<std::size_t>(rt.world().rank())).ops) {
        comm_bytes += static_cast<double>(op.bytes);
        comm_calls += static_cast<double>(op.calls);
      }
    }
  }

  const parallax::CommCounters tp_traffic = rt.mesh().tp().counters().since(tp_before_timed);
  const double timed_steps = static_cast<double>(train.steps - kWarmupSteps);
  const double rss_mib = peak_rss_mib();
  const parallax::ModelStateBytes state = engine.model_state_bytes();
  parallax::Communicator& world = rt.world().communicator();
  const auto all_step_ms = gather(world, torch::tensor(step_ms, torch::kDouble));
  const auto all_rss = gather(world, torch::tensor({rss_mib}, torch::kDouble)).view({-1});
  const auto all_state =
      gather(world, torch::tensor({state.params + state.grads + state.optimizer}, torch::kLong)).view({-1});
  const auto all_host = gather(world, torch::tensor({state.host}, torch::kLong)).view({-1});
  const auto all_nvme = gather(world, torch::tensor({state.nvme}, torch::kLong)).view({-1});
  const auto all_comm_bytes = gather(world, torch::tensor({comm_bytes / timed_steps}, torch::kDouble)).view({-1});
  const auto all_comm_calls = gather(world, torch::tensor({comm_calls / timed_steps}, torch::kDouble)).view({-1});

  const auto slowest = std::get<0>(all_step_ms.max(/*dim=*/0));  // per step, the slowest rank
  const auto timed = slowest.narrow(0, kWarmupSteps, train.steps - kWarmupSteps).contiguous();
  const std::vector<double> timed_ms(timed.data_ptr<double>(), timed.data_ptr<double>() + timed.numel());

  char head[256];
  std::snprintf(head, sizeof(head),
                "{\"impl\": \"parallax\", \"zero_stage\": %d, \"offload\": \"%s/%s\", \"ranks\": %d, "
                "\"median_step_ms\": %.3f, ",
                config.zero.stage, parallax::to_string(config.offload.optimizer),
                parallax::to_string(config.offload.param), world.size(), median(timed_ms));
  char tail[512];
  const double loss = engine.last_loss();
  char loss_text[32];
  if (std::isfinite(loss)) {
    std::snprintf(loss_text, sizeof(loss_text), "%.6f", loss);
  } else {
    std::snprintf(loss_text, sizeof(loss_text), "null");  // JSON has no NaN
  }
  using parallax::CommOp;
  std::snprintf(tail, sizeof(tail),
                ", \"tp\": %d, \"sequence_parallel\": %s, \"tp_payload_per_step\": {\"all_reduce\": %.0f, "
                "\"all_gather\": %.0f, \"reduce_scatter\": %.0f}, \"final_loss\": %s, \"losses\": ",
                rt.mesh().degrees().tp, config.tensor_parallel.sequence_parallel ? "true" : "false",
                static_cast<double>(tp_traffic[CommOp::kAllReduce].bytes) / timed_steps,
                static_cast<double>(tp_traffic[CommOp::kAllGather].bytes) / timed_steps,
                static_cast<double>(tp_traffic[CommOp::kReduceScatter].bytes) / timed_steps, loss_text);
  rt.logger().summary(
      head, "\"peak_rss_mib\": ", json_list(all_rss, "%.1f"), ", \"model_state_bytes\": ", json_list(all_state, "%.0f"),
      ", \"host_bytes\": ", json_list(all_host, "%.0f"), ", \"nvme_bytes\": ", json_list(all_nvme, "%.0f"),
      ", \"comm_bytes_per_step\": ", json_list(all_comm_bytes, "%.0f"),
      ", \"comm_calls_per_step\": ", json_list(all_comm_calls, "%.1f"), tail,
      json_list(torch::tensor(losses, torch::kDouble).nan_to_num(-1.0), "%.9g"), "}");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    parallax::InitOptions options;
    options.app_tables = {"model", "data"};
    options.print_summary = false;
    options.description = "Times the GPT example's optimizer steps and prints one JSON line of measurements.";
    options.flags = {{"--write-initial-weights", "PATH",
                      "First write the model's initial parameters (for bench/peers/torch_zero.py)."}};
    auto rt = parallax::init(argc, argv, options);
    try {
      return run(rt);
    } catch (const std::exception& error) {
      return parallax::report_error(error);  // while the runtime is alive, as train_gpt does
    }
  } catch (const std::exception& error) {
    return parallax::report_error(error);
  }
}
