// bench_context_attention: context-parallel attention (ring, balanced and contiguous, and
// all-to-all) on the ranks of the world, against attention over the whole sequence in one
// process, same shapes, same run.
//
// Each contender runs forward and backward of one causal attention layer on this rank's
// part of a sequence of --seq positions; an iteration starts at a barrier and its time is
// the slowest rank's (what a training step waits for). The baseline is the same layer on
// the whole sequence, timed on every rank alone at the same time (so it shares the cores
// as the contenders do). The table reports medians, the speed-up over the whole layer,
// the slowest rank's attention work against the mean (score elements), and the bytes
// each rank sent per layer, forward and backward.
//
//   mpirun -np 4 ./bench/bench_context_attention [--seq 2048] [--batch 1] [--heads 8]
//                                                [--kv-heads 8] [--head-dim 64] [--iters 5]
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "parallax/context_parallel/attention.h"
#include "parallax/core/communicator.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/world.h"
#include "slowest_rank.h"

namespace {

namespace cp_ns = parallax::context_parallel;

struct Options {
  std::int64_t seq = 2048, batch = 1, heads = 8, kv_heads = 8, head_dim = 64;
  int iters = 5;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--seq") o.seq = value;
    else if (flag == "--batch") o.batch = value;
    else if (flag == "--heads") o.heads = value;
    else if (flag == "--kv-heads") o.kv_heads = value;
    else if (flag == "--head-dim") o.head_dim = value;
    else if (flag == "--iters") o.iters = static_cast<int>(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

torch::Tensor whole_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v) {
  const std::int64_t group = q.size(1) / k.size(1), S = q.size(2);
  k = k.repeat_interleave(group, 1);
  v = v.repeat_interleave(group, 1);
  const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  const torch::Tensor future = torch::ones({S, S}, torch::kBool).triu(1);
  return torch::matmul(torch::softmax(scores.masked_fill(future, -INFINITY), -1), v);
}

}  // namespace

int main(int argc, char** argv) {
  parallax::World world_guard(argc, argv);
  const Options o = parse(argc, argv);
  auto world = parallax::create_mpi_world_communicator();
  const int C = world->size(), r = world->rank();
  torch::manual_seed(1 + r);
  auto leaf = [](std::vector<std::int64_t> sizes) { return torch::randn(sizes).requires_grad_(true); };

  const double whole = bench::slowest_rank_median_seconds(*world, o.iters, [&] {
    const torch::Tensor q = leaf({o.batch, o.heads, o.seq, o.head_dim});
    const torch::Tensor kv = leaf({o.batch, o.kv_heads, o.seq, o.head_dim});
    whole_attention(q, kv, kv).sum().backward();
  });
  if (r == 0) {
    std::printf("causal attention, batch %lld, heads %lld (kv %lld), head_dim %lld, sequence %lld, cp = %d\n",
                static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads),
                static_cast<long long>(o.head_dim), static_cast<long long>(o.seq), C);
    std::printf("%-24s %10s %12s %14s %16s\n", "method", "ms/layer", "vs whole", "work max/mean", "MiB sent/rank");
    std::printf("%-24s %10.2f %11.2fx %14s %16s\n", "whole sequence, 1 rank", whole * 1e3, 1.0, "-", "0");
  }
  struct Contender {
    const char* name;
    cp_ns::AttentionMethod method;
    bool balanced;
  };
  for (const Contender& c : {Contender{"ring, load-balanced", cp_ns::AttentionMethod::kRing, true},
                             Contender{"ring, contiguous", cp_ns::AttentionMethod::kRing, false},
                             Contender{"all-to-all", cp_ns::AttentionMethod::kAllToAll, true}}) {
    if (c.method == cp_ns::AttentionMethod::kAllToAll && (o.heads % C != 0 || o.kv_heads % C != 0)) continue;
    const cp_ns::SequenceSplit split(o.seq, C, c.balanced);
    cp_ns::AttentionCounters counters;
    cp_ns::AttentionOptions options;
    options.method = c.method;
    options.counters = &counters;
    const parallax::CommCounters before = world->counters();
    const double seconds = bench::slowest_rank_median_seconds(*world, o.iters, [&] {
      const torch::Tensor q = leaf({o.batch, o.heads, split.local_len(), o.head_dim});
      const torch::Tensor kv = leaf({o.batch, o.kv_heads, split.local_len(), o.head_dim});
      cp_ns::context_attention(q, kv, kv, *world, split, options).sum().backward();
    });
    const parallax::CommCounters spent = world->counters().since(before);
    const double layers = static_cast<double>(counters.calls);
    torch::Tensor work = torch::zeros({C}, torch::kDouble);
    work[r] = static_cast<double>(counters.score_elements);
    world->all_reduce(work)->wait();
    const double sent_mib = spent[parallax::CommOp::kSend].bytes / layers / (1 << 20);
    if (r == 0) {
      std::printf("%-24s %10.2f %11.2fx %14.3f %16.2f\n", c.name, seconds * 1e3, whole / seconds,
                  (work.max() / work.mean()).item<double>(), sent_mib);
    }
  }
  return 0;
}
