// Pipeline bubbles, measured and simulated, against the textbook (p−1)/(m+p−1).
//
// Run under `mpirun -np 2` (bench/pipeline.sh does). Two tables on rank 0:
//  1. Measured: the GPT example over pp = 2 (one thread per rank) for every schedule and
//     m = 2, 4, 8, 16 micro-batches: the engine's own bubble fraction (metrics file
//     field, 1 − compute / the longest schedule, mean over ranks) next to the formula and
//     to the same schedule simulated with this machine's measured per-layer times, as
//     ratios.
//  2. Simulated for p = 4 and 8: the real instruction lists (pipeline::make_schedule)
//     run by pipeline::simulate with the per-layer forward, backward, input-gradient and
//     weight-gradient times measured here (a deeper model of the same blocks, cut by
//     measured time) and the measured point-to-point time of one activation.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "gpt.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/world.h"
#include "parallax/pipeline/partition.h"
#include "parallax/pipeline/schedule.h"
#include "parallax/pipeline/split_backward.h"
#include "parallax/runtime/parallax.h"

namespace {

namespace pl = parallax::pipeline;

struct LayerTimes {
  double forward = 0, backward = 0, input = 0, weight = 0;  // ms
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Forward, whole backward, and zb-h1's two halves of each layer on `micro` (median of 9).
std::vector<LayerTimes> time_layers(const std::vector<pl::LayerSpec>& specs, const pl::MicroBatch& micro) {
  std::vector<LayerTimes> times;
  pl::Activation x = micro.inputs;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto module = pl::build_seeded(specs[i].build, 1, static_cast<std::int64_t>(i));
    std::vector<torch::Tensor> params;
    for (const auto& p : module->parameters()) params.push_back(p);
    std::vector<double> f, b, in, w;
    pl::Activation out;
    for (int r = 0; r < 9; ++r) {
      for (int half = 0; half < 2; ++half) {
        pl::Activation leaves;
        for (const auto& t : x) leaves.push_back(t.is_floating_point() ? t.detach().requires_grad_(true) : t);
        auto start = std::chrono::steady_clock::now();
        out = specs[i].forward(*module, leaves);
        torch::Tensor root = i + 1 == specs.size() ? gpt::pipeline_loss(out, micro.targets) : out[0];
        const torch::Tensor grad = i + 1 == specs.size() ? torch::ones_like(root) : torch::randn_like(root);
        if (half == 0) f.push_back(ms_since(start));
        if (half == 0) {
          start = std::chrono::steady_clock::now();
          torch::autograd::backward({root}, {grad});
          b.push_back(ms_since(start));
        } else {
          // zb-h1's two passes, as the executor runs them.
          start = std::chrono::steady_clock::now();
          std::vector<torch::Tensor> input_grads;
          pl::detail::SplitBackward split({root}, {grad}, leaves, params, input_grads);
          in.push_back(ms_since(start));
          start = std::chrono::steady_clock::now();
          split.weight_pass();
          w.push_back(ms_since(start));
        }
      }
    }
    times.push_back({median(f), median(b), median(in), median(w)});
    x = {out[0].detach()};
  }
  return times;
}

// Costs of `shape`'s stages for a model whose layer i costs times[i], cut by forward +
// backward time; a stage's chunk cost is the mean over its chunks.
std::vector<pl::StageCosts> stage_costs(const pl::ScheduleShape& shape, const std::vector<LayerTimes>& times) {
  std::vector<double> weights;
  for (const LayerTimes& t : times) weights.push_back(t.forward + t.backward);
  const auto cut = pl::balanced_boundaries(weights, shape.parts());
  std::vector<pl::StageCosts> costs(shape.stages, pl::StageCosts{0, 0, 0, 0});
  for (int part = 0; part < shape.parts(); ++part) {
    pl::StageCosts& c = costs[part % shape.stages];
    for (std::int64_t l = cut[part]; l < cut[part + 1]; ++l) {
      c.forward += times[l].forward / shape.virtual_stages;
      c.backward += times[l].backward / shape.virtual_stages;
      c.backward_input += times[l].input / shape.virtual_stages;
      c.backward_weight += times[l].weight / shape.virtual_stages;
    }
  }
  return costs;
}

double mean_bubble(const pl::Simulation& sim, int stages) {
  double sum = 0;
  for (int s = 0; s < stages; ++s) sum += sim.bubble_fraction(s);
  return sum / stages;
}

struct Schedule {
  const char* name;
  parallax::PipelineSchedule kind;
  int chunks;
};
const Schedule kSchedules[] = {{"gpipe", parallax::PipelineSchedule::kGPipe, 1},
                               {"1f1b", parallax::PipelineSchedule::k1F1B, 1},
                               {"interleaved", parallax::PipelineSchedule::kInterleaved, 2},
                               {"zb-h1", parallax::PipelineSchedule::kZbH1, 1}};

parallax::Config bench_config(const std::vector<std::string>& extra) {
  parallax::ConfigSources sources;
  sources.files = {PARALLAX_SOURCE_DIR "/configs/pp.toml"};
  sources.overrides = {"logging.every=0",     "model.d_model=128",    "model.n_layer=6",
                       "model.block_size=64", "model.vocab_size=256", "train.micro_batch_size=4"};
  sources.overrides.insert(sources.overrides.end(), extra.begin(), extra.end());
  return parallax::load_config(sources, {{"model", "data"}});
}

}  // namespace

int main(int argc, char** argv) {
  // MPI for the whole run: each case's Runtime comes and goes inside it.
  parallax::World world(argc, argv);
  try {
    const int steps = argc > 1 ? std::atoi(argv[1]) : 6;
    at::set_num_threads(1);
    std::vector<std::string> rows;
    std::vector<LayerTimes> times;
    double transfer_ms = 0;
    int rank = 0;
    for (const Schedule& schedule : kSchedules) {
      for (int m : {2, 4, 8, 16}) {
        auto config = bench_config(
            {"train.grad_accum=" + std::to_string(m), "train.global_batch_size=" + std::to_string(4 * m),
             "train.steps=" + std::to_string(steps + 2), std::string("pipeline.schedule=\"") + schedule.name + "\"",
             "pipeline.virtual_stages=" + std::to_string(schedule.chunks)});
        parallax::Runtime rt(std::move(config), {{"model", "data"}, /*print_summary=*/false});
        const auto& c = rt.config();
        PARALLAX_CHECK(rt.world().size() == 2, UsageError, "bench_pipeline runs on 2 ranks (pp = 2)");
        rank = rt.world().rank();
        const auto options = gpt::GPTOptions::from_table(c.app_table("model"));
        const gpt::SyntheticTokens data(options.vocab_size, options.block_size, c.train.seed);
        auto micro_batch = [&](std::int64_t step, std::int64_t micro) {
          auto [inputs, targets] = data.batch(gpt::first_sample(step, micro, 0, 1, 4, m), 4);
          return pl::MicroBatch{{inputs}, {targets}};
        };
        if (times.empty()) {
          times = time_layers(gpt::layer_specs(options), micro_batch(0, 0));
          // One activation between the two ranks, half a round trip (median of 20).
          auto& comm = rt.mesh().pp();
          torch::Tensor activation = torch::zeros({4, options.block_size, options.d_model});
          std::vector<double> trips;
          for (int r = 0; r < 20; ++r) {
            const auto start = std::chrono::steady_clock::now();
            if (rt.mesh().coord().pp == 0) {
              comm.send(activation, 1, 9)->wait();
              comm.recv(activation, 1, 9)->wait();
            } else {
              comm.recv(activation, 0, 9)->wait();
              comm.send(activation, 0, 9)->wait();
            }
            trips.push_back(ms_since(start) / 2);
          }
          transfer_ms = median(trips);
        }
        parallax::PipelineEngine engine(rt, gpt::layer_specs(options), gpt::pipeline_loss,
                                        parallax::OptimizerSpec::from(c));
        std::vector<double> bubbles, step_ms;
        for (std::int64_t step = 0; step < c.train.steps; ++step) {
          std::int64_t micro = 0;
          engine.train_batch([&] { return micro_batch(step, micro++); });
          if (step < 2) continue;  // warm-up
          const auto& fractions = engine.last_metrics().bubble_fraction;
          bubbles.push_back(std::accumulate(fractions.begin(), fractions.end(), 0.0) / fractions.size());
          step_ms.push_back(engine.last_metrics().step_ms);
        }
        const pl::ScheduleShape shape{schedule.kind, 2, m, schedule.chunks};
        std::vector<std::vector<pl::Instruction>> lists{pl::make_schedule(shape, 0), pl::make_schedule(shape, 1)};
        const double simulated = mean_bubble(pl::simulate(shape, lists, stage_costs(shape, times), transfer_ms), 2);
        const double formula = 1.0 / (m + 1);
        const double measured = median(bubbles);
        char row[256];
        std::snprintf(row, sizeof(row), "%-12s %3d %9.1f %9.3f %9.3f %7.2f %10.3f %7.2f", schedule.name, m,
                      median(step_ms), measured, formula, measured / formula, simulated, measured / simulated);
        rows.push_back(row);
      }
    }
    if (rank != 0) return 0;
    std::printf(
        "# measured: pp = 2 on 2 ranks, one thread each; GPT d_model 128, 6 blocks, 64 tokens, micro-batch 4;"
        " %d steps after 2 warm-up\n",
        steps);
    std::printf(
        "# bubble = 1 - compute / the longest schedule (metrics bubble_fraction, mean over ranks); "
        "formula = (p-1)/(m+p-1); simulated = the same lists with this machine's layer times\n");
    std::printf("%-12s %3s %9s %9s %9s %7s %10s %7s\n", "schedule", "m", "step ms", "bubble", "formula", "ratio",
                "simulated", "ratio");
    for (const std::string& row : rows) std::printf("%s\n", row.c_str());

    // Simulated for larger p: a 32-block model of the measured block (layer 1 stands for
    // every block), the measured embeddings and head at the ends.
    std::vector<LayerTimes> deep{times.front()};
    for (int i = 0; i < 32; ++i) deep.push_back(times[1]);
    deep.push_back(times.back());
    std::printf(
        "\n# simulated: the real schedules with measured layer times (forward %.3f, backward %.3f = input "
        "%.3f + weight %.3f ms per block; transfer %.3f ms), 34 layers cut by time\n",
        times[1].forward, times[1].backward, times[1].input, times[1].weight, transfer_ms);
    std::printf("%-12s %3s %3s %10s %9s %7s\n", "schedule", "p", "m", "simulated", "formula", "ratio");
    for (int p : {4, 8}) {
      for (const Schedule& schedule : kSchedules) {
        for (int m : {2, 4, 8, 16}) {
          const pl::ScheduleShape shape{schedule.kind, p, m, schedule.chunks};
          std::vector<std::vector<pl::Instruction>> lists;
          for (int s = 0; s < p; ++s) lists.push_back(pl::make_schedule(shape, s));
          const double simulated = mean_bubble(pl::simulate(shape, lists, stage_costs(shape, deep), transfer_ms), p);
          const double formula = static_cast<double>(p - 1) / (m + p - 1);
          std::printf("%-12s %3d %3d %10.3f %9.3f %7.2f\n", schedule.name, p, m, simulated, formula,
                      simulated / formula);
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    return parallax::report_error(e);
  }
}
