// bench_moe_layer: one mixture-of-experts layer (forward and backward) with its experts
// shared out over the ranks of the world (ep = world size) against the same layer with
// every expert on every rank (each rank routing its own tokens to local experts: plain
// data parallelism, no all-to-all), same shapes, same run.
//
// Each rank routes --tokens tokens of --hidden features to --top-k of --experts experts
// (MLPs of --ffn hidden units), dropless. An iteration starts at a barrier and its time is
// the slowest rank's (what a training step waits for); medians over --iters. The table
// also prints the bytes each rank's all-to-alls sent per layer (forward and backward)
// and the same from the routing counts' formula.
//
//   mpirun -np 4 ./bench/bench_moe_layer [--tokens 1024] [--hidden 256] [--ffn 512]
//                                        [--experts 8] [--top-k 2] [--iters 11]
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/world.h"
#include "slowest_rank.h"
#include "parallax/expert_parallel/moe_layer.h"

namespace {

namespace ep_ns = parallax::expert_parallel;

struct Options {
  std::int64_t tokens = 1024, hidden = 256, ffn = 512, experts = 8, top_k = 2;
  int iters = 11;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--tokens")
      o.tokens = value;
    else if (flag == "--hidden")
      o.hidden = value;
    else if (flag == "--ffn")
      o.ffn = value;
    else if (flag == "--experts")
      o.experts = value;
    else if (flag == "--top-k")
      o.top_k = value;
    else if (flag == "--iters")
      o.iters = static_cast<int>(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  parallax::World world_guard(argc, argv);
  const Options o = parse(argc, argv);
  auto world = parallax::create_mpi_world_communicator();
  const int P = world->size(), r = world->rank();
  const ep_ns::MoeOptions options = ep_ns::MoeOptions(o.experts, o.top_k).aux_loss_coef(0.01);
  torch::manual_seed(1);
  ep_ns::MoeLayer local(o.hidden, o.ffn, options);
  local->set_token_group(world.get());
  torch::manual_seed(1);
  ep_ns::MoeLayer spread(o.hidden, o.ffn, options);
  spread->distribute(*world, world.get());
  torch::manual_seed(2 + r);
  const torch::Tensor x = torch::randn({1, o.tokens, o.hidden});

  auto step = [&](ep_ns::MoeLayer& layer) {
    const torch::Tensor input = x.detach().requires_grad_(true);
    layer(input).sum().backward();
    layer->zero_grad();
  };
  const double replicated = bench::slowest_rank_median_seconds(*world, o.iters, [&] { step(local); });
  spread->take_stats();
  const parallax::CommCounters before = world->counters();
  const double expert_parallel = bench::slowest_rank_median_seconds(*world, o.iters, [&] { step(spread); });
  const parallax::CommCounters spent = world->counters().since(before);
  const ep_ns::RoutingStats stats = spread->take_stats();
  const double layers = static_cast<double>(stats.forwards);
  // Forward's rows and counts (the layer's own count), backward's rows again.
  const double count_bytes = static_cast<double>((P - 1) * (o.experts / P) * 8);
  const double formula =
      2.0 * (static_cast<double>(stats.exchange_bytes) - layers * count_bytes) / layers + count_bytes;
  const double measured = static_cast<double>(spent[parallax::CommOp::kAllToAll].bytes) / layers;
  torch::Tensor worst = torch::tensor({stats.imbalance()}, torch::kDouble);
  parallax::CollectiveOptions max;
  max.reduce_op = parallax::ReduceOp::kMax;
  world->all_reduce(worst, max)->wait();
  if (r == 0) {
    std::printf("MoE layer: %lld tokens/rank, hidden %lld, ffn %lld, %lld experts, top-%lld, dropless, ranks %d\n",
                static_cast<long long>(o.tokens), static_cast<long long>(o.hidden), static_cast<long long>(o.ffn),
                static_cast<long long>(o.experts), static_cast<long long>(o.top_k), P);
    std::printf("%-30s %10s %16s %18s\n", "layout", "ms/layer", "KiB sent/rank", "formula KiB/rank");
    std::printf("%-30s %10.2f %16s %18s\n", "every expert on every rank", replicated * 1e3, "0", "0");
    std::printf("%-30s %10.2f %16.1f %18.1f\n", ("parallax ep = " + std::to_string(P)).c_str(), expert_parallel * 1e3,
                measured / 1024, formula / 1024);
    std::printf("tokens per expert, max/mean on rank 0's batch: %.2f (worst rank %.2f)\n", stats.imbalance(),
                worst.item<double>());
  }
  return 0;
}
