#include "parallax/runtime/layer_profile.h"

#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/core/world.h"
#include "parallax/runtime/program_flags.h"

namespace parallax {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

at::ScalarType scalar_type_of(Dtype dtype) {
  return dtype == Dtype::kBf16 ? at::kBFloat16 : dtype == Dtype::kFp16 ? at::kHalf : at::kFloat;
}

at::Tensor parameter(std::vector<std::int64_t> sizes, at::ScalarType type) {
  return (at::randn(sizes, at::kFloat) * 0.02).to(type).requires_grad_(true);
}

// The median of three (after one warm-up) forward and backward times of `forward`'s
// output summed. The median, not the best: with more ranks than cores the best is a run
// whose neighbours happened to wait, which training does not see.
template <typename Forward>
planner::LayerTimes time_layer(Forward&& forward) {
  std::vector<double> forwards, backwards;
  for (int run = 0; run < 4; ++run) {
    const auto start = Clock::now();
    at::Tensor loss = forward();
    const double forward_s = seconds_since(start);
    const auto middle = Clock::now();
    loss.backward();
    const double backward_s = seconds_since(middle);
    if (run == 0) continue;
    forwards.push_back(forward_s);
    backwards.push_back(backward_s);
  }
  std::sort(forwards.begin(), forwards.end());
  std::sort(backwards.begin(), backwards.end());
  return {forwards[forwards.size() / 2], backwards[backwards.size() / 2]};
}

// One pre-LayerNorm GPT block as examples/gpt builds it, on one of `tp` ranks: qkv and
// the MLP's first layer split by columns, the projections by rows.
planner::LayerTimes time_block(const planner::TransformerShape& m, std::int64_t micro_batch, int tp,
                               at::ScalarType type) {
  const std::int64_t h = m.hidden, kv = m.kv_width() / tp, q = h / tp, f = m.ffn_width() / tp;
  const std::int64_t heads = m.heads / tp, head_dim = h / m.heads;
  const at::Tensor x = at::randn({micro_batch, m.seq, h}, at::kFloat).to(type).requires_grad_(true);
  const at::Tensor ln1_w = parameter({h}, type), ln1_b = parameter({h}, type);
  const at::Tensor ln2_w = parameter({h}, type), ln2_b = parameter({h}, type);
  const at::Tensor w_qkv = parameter({q + 2 * kv, h}, type), b_qkv = parameter({q + 2 * kv}, type);
  const at::Tensor w_proj = parameter({h, q}, type), b_proj = parameter({h}, type);
  const at::Tensor w_fc = parameter({f, h}, type), b_fc = parameter({f}, type);
  const at::Tensor w_out = parameter({h, f}, type), b_out = parameter({h}, type);
  const at::Tensor future = at::ones({m.seq, m.seq}, at::kBool).triu(1);
  return time_layer([&] {
    const at::Tensor a = at::layer_norm(x, {h}, ln1_w, ln1_b);
    const std::vector<at::Tensor> parts = at::linear(a, w_qkv, b_qkv).split_with_sizes({q, kv, kv}, -1);
    const auto split_heads = [&](const at::Tensor& t) {
      return t.view({micro_batch, m.seq, -1, head_dim}).transpose(1, 2);
    };
    at::Tensor k = split_heads(parts[1]), v = split_heads(parts[2]);
    if (k.size(1) != heads) {  // grouped keys and values: each serves heads / kv_heads queries
      k = k.repeat_interleave(heads / k.size(1), 1);
      v = v.repeat_interleave(heads / v.size(1), 1);
    }
    const at::Tensor scores = at::matmul(split_heads(parts[0]), k.transpose(-2, -1)) / std::sqrt(double(head_dim));
    const at::Tensor attention = at::softmax(scores.masked_fill(future, -INFINITY), -1);
    const at::Tensor y = at::matmul(attention, v).transpose(1, 2).reshape({micro_batch, m.seq, q});
    const at::Tensor h1 = x + at::linear(y, w_proj, b_proj);
    const at::Tensor g = at::gelu(at::linear(at::layer_norm(h1, {h}, ln2_w, ln2_b), w_fc, b_fc));
    return (h1 + at::linear(g, w_out, b_out)).sum();
  });
}

// The final LayerNorm, the LM head (its vocabulary split over tp) and the loss in fp32.
planner::LayerTimes time_head(const planner::TransformerShape& m, std::int64_t micro_batch, int tp,
                              at::ScalarType type) {
  const std::int64_t h = m.hidden, vocab = m.vocab / tp;
  const at::Tensor x = at::randn({micro_batch, m.seq, h}, at::kFloat).to(type).requires_grad_(true);
  const at::Tensor ln_w = parameter({h}, type), ln_b = parameter({h}, type);
  const at::Tensor w = parameter({vocab, h}, type);
  const at::Tensor targets = at::randint(vocab, {micro_batch * m.seq}, at::kLong);
  return time_layer([&] {
    const at::Tensor logits = at::linear(at::layer_norm(x, {h}, ln_w, ln_b), w);
    return at::cross_entropy_loss(logits.reshape({-1, vocab}).to(at::kFloat), targets);
  });
}

// host name, CPU model, logical CPUs and this rank's threads: what the times depend on
// besides the model, the dtype and the rank count.
std::string this_machine() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string cpu = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return std::string(host) + ", " + cpu + ", " + std::to_string(std::thread::hardware_concurrency()) +
         " logical CPUs, " + std::to_string(at::get_num_threads()) + " threads per rank";
}

// The best of three timings of `action`, in seconds.
template <typename Action>
double best_of_three(Action&& action) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    action();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

// The median of seven timings of `action` (after one warm-up), in seconds.
template <typename Action>
double median_of_seven(Action&& action) {
  action();
  std::vector<double> times;
  for (int i = 0; i < 7; ++i) {
    const auto start = Clock::now();
    action();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[3];
}

// A ring all-reduce's α–β over `group` (from 1 MiB and 16 bytes): {bytes/s, s per hop},
// {0, 0} for a group of one.
std::pair<double, double> all_reduce_alpha_beta(Communicator& group) {
  if (group.size() == 1) return {0.0, 0.0};
  const int ranks = group.size();
  at::Tensor big = at::ones({256 * 1024});
  at::Tensor small = at::ones({4});
  // The median, not the best, as for the layers: with more ranks than cores the best
  // all-reduce is one whose ranks all happened to be running, which training's many
  // small tensor-parallel all-reduces do not see.
  const double big_s = median_of_seven([&] { group.all_reduce(big)->wait(); });
  const double small_s = median_of_seven([&] { group.all_reduce(small)->wait(); });
  return {2.0 * (ranks - 1) / ranks * static_cast<double>(big.nbytes()) / std::max(1e-9, big_s - small_s),
          small_s / (2.0 * (ranks - 1))};
}

// Memory bandwidth (the optimizer step's bound: a += b over 32 MiB each, 12 bytes moved
// per element) and the two link classes: an all-reduce within each node (its ranks), then
// one between the nodes (one rank of each, every local rank's group at once), every rank
// at once as in training; rank 0's figures for everyone. Nodes are the hosts MPI found.
void measure_machine(planner::MeasuredProfile& measured, World& world) {
  Communicator& comm = world.communicator();
  const at::Tensor a = at::ones({8 * 1024 * 1024});
  const at::Tensor b = at::ones({8 * 1024 * 1024});
  comm.barrier()->wait();
  const double add = best_of_three([&] { a.add_(b); });
  const std::vector<std::string> hosts = all_gather_strings(comm, world.hostname());
  const int node = static_cast<int>(std::find(hosts.begin(), hosts.end(), world.hostname()) - hosts.begin());
  const std::unique_ptr<Communicator> within = comm.split(node, comm.rank(), "profile within node");
  const std::pair<double, double> intra = all_reduce_alpha_beta(*within);
  const std::unique_ptr<Communicator> between = comm.split(world.local_rank(), comm.rank(), "profile between nodes");
  const std::pair<double, double> inter = all_reduce_alpha_beta(*between);
  at::Tensor figures =
      at::tensor({12.0 * static_cast<double>(a.numel()) / add, intra.first, intra.second, inter.first, inter.second},
                 at::kDouble);
  comm.broadcast(figures, 0)->wait();
  const double* f = figures.data_ptr<double>();
  measured.memory_bandwidth = f[0];
  measured.link_bandwidth = f[1];
  measured.link_latency = f[2];
  measured.inter_node_link_bandwidth = f[3];
  measured.inter_node_link_latency = f[4];
}

std::string cache_directory_of(const std::string& configured) {
  if (configured == "none") return "";
  if (!configured.empty()) return configured;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/parallax";
  const char* home = std::getenv("HOME");
  return home != nullptr && *home != '\0' ? std::string(home) + "/.cache/parallax" : "";
}

}  // namespace

LayerProfile profile_layers(const planner::TransformerShape& model,
                            Dtype dtype,
                            const std::vector<std::int64_t>& micro_batches,
                            const std::vector<int>& tps,
                            const std::string& cache_directory,
                            World& world) {
  Communicator& comm = world.communicator();
  const at::ScalarType type = scalar_type_of(dtype);
  std::vector<std::pair<std::int64_t, int>> shapes;
  for (int tp : tps) {
    const std::int64_t kv_heads = model.kv_heads > 0 ? model.kv_heads : model.heads;
    if (model.heads % tp != 0 || kv_heads % tp != 0 || model.ffn_width() % tp != 0 || model.vocab % tp != 0) continue;
    for (std::int64_t micro_batch : micro_batches) shapes.emplace_back(micro_batch, tp);
  }
  const auto n = static_cast<std::int64_t>(shapes.size());
  LayerProfile result;
  planner::MeasuredProfile& measured = result.measured;
  measured.model = model;
  measured.dtype = to_string(dtype);
  measured.machine = this_machine();
  measured.world_size = comm.size();
  measured.local_size = world.local_size();
  measured.build = library_versions();

  // Rank 0 reads what the file has for these conditions: column 0 says found, 1..4 the
  // block's and the head's forward and backward seconds; the machine's figures apart.
  const std::string directory = cache_directory_of(cache_directory);
  if (!directory.empty()) result.file = directory + "/" + measured.file_name();
  planner::MeasuredProfile cached = measured;
  at::Tensor known = at::zeros({n, 5}, at::kDouble);
  at::Tensor machine = at::zeros({7}, at::kDouble);  // the five figures, the correction, its runs
  if (comm.rank() == 0 && !result.file.empty() && std::filesystem::exists(result.file)) {
    try {
      planner::MeasuredProfile file = planner::read_profile(result.file);
      if (file.same_conditions(measured)) {
        cached = std::move(file);
      } else {
        result.cache_problem = result.file + " was measured under other conditions (" + file.machine + ", " +
                               std::to_string(file.world_size) + " ranks, " + file.build + ")";
      }
    } catch (const ConfigError& e) {
      result.cache_problem = e.detail();
    }
    if (cached.memory_bandwidth > 0) {
      machine = at::tensor({cached.memory_bandwidth, cached.link_bandwidth, cached.link_latency,
                            cached.inter_node_link_bandwidth, cached.inter_node_link_latency,
                            cached.step_time_correction(), static_cast<double>(cached.step_time_ratios.size())},
                           at::kDouble);
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const auto block = cached.block.find(shapes[i]);
      const auto head = cached.head.find(shapes[i]);
      if (block == cached.block.end() || head == cached.head.end()) continue;
      double* row = known[i].data_ptr<double>();
      row[0] = 1;
      row[1] = block->second.forward;
      row[2] = block->second.backward;
      row[3] = head->second.forward;
      row[4] = head->second.backward;
    }
  }
  comm.broadcast(known, 0)->wait();
  comm.broadcast(machine, 0)->wait();
  result.machine_from_file = machine[0].item<double>() > 0;
  result.correction_runs = static_cast<std::size_t>(machine[6].item<double>());
  if (result.correction_runs > 0) result.step_time_correction = machine[5].item<double>();
  if (result.machine_from_file) {
    measured.memory_bandwidth = machine[0].item<double>();
    measured.link_bandwidth = machine[1].item<double>();
    measured.link_latency = machine[2].item<double>();
    measured.inter_node_link_bandwidth = machine[3].item<double>();
    measured.inter_node_link_latency = machine[4].item<double>();
  } else {
    measure_machine(measured, world);
  }

  // Every rank times the shapes the file lacks, all at once.
  at::Tensor times = at::zeros({n, 4}, at::kDouble);
  comm.barrier()->wait();
  for (std::int64_t i = 0; i < n; ++i) {
    if (known[i][0].item<double>() != 0) continue;
    const planner::LayerTimes block = time_block(model, shapes[i].first, shapes[i].second, type);
    const planner::LayerTimes head = time_head(model, shapes[i].first, shapes[i].second, type);
    double* row = times[i].data_ptr<double>();
    row[0] = block.forward;
    row[1] = block.backward;
    row[2] = head.forward;
    row[3] = head.backward;
    ++result.timed;
  }
  // The mean over ranks (each saw its own neighbours), then rank 0's copy of it for
  // everyone, so every rank plans from bit-identical figures.
  comm.all_reduce(times)->wait();
  times.div_(comm.size());
  comm.broadcast(times, 0)->wait();
  for (std::int64_t i = 0; i < n; ++i) {
    const bool from_file = known[i][0].item<double>() != 0;
    const double* row = from_file ? known[i].data_ptr<double>() + 1 : times[i].data_ptr<double>();
    measured.block[shapes[i]] = {row[0], row[1]};
    measured.head[shapes[i]] = {row[2], row[3]};
    if (from_file) ++result.from_file;
  }
  // Rank 0 keeps the file's other shapes too, and writes when it timed something new.
  if (comm.rank() == 0 && !result.file.empty() && (result.timed > 0 || !result.machine_from_file)) {
    cached.memory_bandwidth = measured.memory_bandwidth;
    cached.link_bandwidth = measured.link_bandwidth;
    cached.link_latency = measured.link_latency;
    cached.inter_node_link_bandwidth = measured.inter_node_link_bandwidth;
    cached.inter_node_link_latency = measured.inter_node_link_latency;
    for (const auto& [shape, times_of_shape] : measured.block) cached.block[shape] = times_of_shape;
    for (const auto& [shape, times_of_shape] : measured.head) cached.head[shape] = times_of_shape;
    try {
      planner::write_profile(result.file, cached);
    } catch (const ConfigError& e) {
      result.cache_problem = e.detail();
    }
  }
  return result;
}

std::string record_step_time_ratio(const std::string& file, double ratio) {
  if (file.empty()) return "";
  try {
    planner::MeasuredProfile profile = planner::read_profile(file);
    profile.add_step_time_ratio(ratio);
    planner::write_profile(file, profile);
    return "";
  } catch (const ConfigError& e) {
    return e.detail();
  }
}

}  // namespace parallax
