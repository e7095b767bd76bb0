#include "parallax/runtime/auto_layout.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "parallax/core/error.h"
#include "parallax/core/world.h"
#include "parallax/planner/plan_search.h"
#include "parallax/runtime/layer_profile.h"

namespace parallax {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
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

// This machine as the planner sees it: rank 0's measurements, shared with every rank.
planner::ClusterSpec measure_this_cluster(const Config& config, World& world) {
  Communicator& comm = world.communicator();
  // Every rank computes at once, as in training, so the rate is what a rank gets when
  // its neighbours compute too.
  const std::int64_t n = 384;
  const at::Tensor a = at::rand({n, n});
  const at::Tensor b = at::rand({n, n});
  comm.barrier()->wait();
  const double matmul = best_of_three([&] { (void)at::mm(a, b).sum().item<float>(); });
  // Memory bandwidth (the optimizer step's bound): a += b over 32 MiB each, 12 bytes moved
  // per element, every rank at once.
  const at::Tensor big_a = at::ones({8 * 1024 * 1024});
  const at::Tensor big_b = at::ones({8 * 1024 * 1024});
  const double add = best_of_three([&] { big_a.add_(big_b); });
  double bandwidth = 0;
  double latency = 0;
  if (world.size() > 1) {
    const int ranks = world.size();
    at::Tensor big = at::ones({256 * 1024});  // 1 MiB
    at::Tensor small = at::ones({2});
    const double big_s = best_of_three([&] { comm.all_reduce(big)->wait(); });
    const double small_s = best_of_three([&] { comm.all_reduce(small)->wait(); });
    latency = small_s / (2.0 * (ranks - 1));
    bandwidth = 2.0 * (ranks - 1) / ranks * static_cast<double>(big.nbytes()) / std::max(1e-9, big_s - small_s);
  }
  at::Tensor figures = at::tensor(
      {2.0 * n * n * n / matmul, bandwidth, latency, 12.0 * static_cast<double>(big_a.numel()) / add}, at::kDouble);
  comm.broadcast(figures, 0)->wait();
  const double* f = figures.data_ptr<double>();

  planner::ClusterSpec cluster = planner::ClusterSpec::preset("cpu", 1);
  cluster.name = "this machine";
  cluster.nodes = config.topology.emulate_nodes > 0 ? static_cast<int>(config.topology.emulate_nodes)
                                                    : std::max(1, world.size() / std::max(1, world.local_size()));
  cluster.devices_per_node = std::max(1, world.size() / cluster.nodes);
  const double host_memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  cluster.device_memory_bytes = host_memory / std::max(1, world.local_size());
  cluster.peak_flops = f[0];
  cluster.achievable_fraction = 1.0;  // measured, not a datasheet's
  cluster.memory_bandwidth = f[3];
  cluster.host_bandwidth = f[3];
  cluster.host_adam_elements_per_second = f[3] / 32.0;  // parameter, gradient, two moments read and written
  if (world.size() > 1) {
    cluster.intra_bandwidth = cluster.inter_bandwidth = f[1];
    cluster.intra_latency = cluster.inter_latency = f[2];
  }
  return cluster;
}

// The layout keys the planner keeps. In auto mode, those the config sets (not to
// "auto"); in manual mode with some keys "auto", every other layout key, at its value.
planner::LayoutConstraints constraints_of(const Config& c) {
  planner::LayoutConstraints fixed;
  const bool manual = c.parallel.mode == ParallelMode::kManual;
  const auto set = [&c, manual](const char* key) {
    return c.auto_keys.count(key) == 0 && (manual || !c.position_of(key).empty());
  };
  if (set("parallel.tp")) fixed.tp = c.parallel.tp;
  if (set("parallel.pp")) fixed.pp = c.parallel.pp;
  if (set("parallel.dp") && c.parallel.dp > 0) fixed.dp = c.parallel.dp;
  if (set("zero.stage")) fixed.zero_stage = c.zero.stage;
  if (set("offload.optimizer")) fixed.offload_optimizer = c.offload.optimizer;
  if (set("offload.param")) fixed.offload_param = c.offload.param;
  if (set("pipeline.schedule")) fixed.schedule = c.pipeline.schedule;
  if (set("pipeline.virtual_stages")) fixed.virtual_stages = c.pipeline.virtual_stages;
  if (set("pipeline.recompute")) fixed.recompute = c.pipeline.recompute;
  if (set("train.micro_batch_size") && c.train.micro_batch_size > 0) fixed.micro_batch_size = c.train.micro_batch_size;
  if (set("train.grad_accum") && c.train.grad_accum > 0) fixed.grad_accum = c.train.grad_accum;
  return fixed;
}

constexpr const char* kChosen = " (chosen by parallel.mode = \"auto\")";

std::int64_t status_kilobytes(const char* field) {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return 0;
  char line[256];
  long long kilobytes = 0;
  const std::size_t length = std::strlen(field);
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::strncmp(line, field, length) == 0 && line[length] == ':') {
      std::sscanf(line + length + 1, "%lld", &kilobytes);
      break;
    }
  }
  std::fclose(status);
  return kilobytes * 1024;
}

}  // namespace

std::int64_t resident_bytes() {
  return status_kilobytes("VmRSS");
}

std::int64_t peak_resident_bytes() {
  return status_kilobytes("VmHWM");
}

AutoLayout choose_auto_layout(Config& config, World& world) {
  if (config.parallel.mode != ParallelMode::kAuto && config.auto_keys.empty()) return {};
  std::string mode = "parallel.mode = \"auto\"" + config.position_of("parallel.mode");
  if (config.parallel.mode != ParallelMode::kAuto) {
    mode.clear();
    for (const std::string& key : config.auto_keys) {
      mode += (mode.empty() ? "" : ", ") + key + " = \"auto\"" + config.position_of(key);
    }
  }
  PARALLAX_CHECK(config.app.count("model") != 0, ConfigError, mode,
                 " plans from the model's shape: give a [model] table (n_layer, d_model, n_head, vocab_size, "
                 "block_size; a transformer), or set parallel.mode = \"manual\" with tp, pp and dp");
  PARALLAX_CHECK(config.train.global_batch_size > 0, ConfigError, mode,
                 " plans for a global batch: set train.global_batch_size");
  PARALLAX_CHECK(config.train.device == TrainDevice::kCpu, ConfigError, mode,
                 " measures this machine's CPU ranks; on train.device = \"cuda\" plan offline with `parallax plan "
                 "--cluster <preset> --emit-config FILE`");
  const auto start = Clock::now();
  planner::PlanQuery query;
  query.model = planner::TransformerShape::from_table(config.app_table("model"));
  query.cluster = measure_this_cluster(config, world);
  query.global_batch = config.train.global_batch_size;
  query.base = config;
  query.base.parallel.mode = ParallelMode::kManual;
  query.tp_needs_plan = true;
  query.max_memory_bytes = config.automatic.max_memory_gb * 1e9;
  query.preference = config.automatic.prefer == AutoPreference::kMemory ? planner::Preference::kMemory
                                                                        : planner::Preference::kThroughput;
  const planner::LayoutConstraints fixed = constraints_of(config);
  // The model's own layers timed here at every micro-batch and split a plan may take.
  std::vector<std::int64_t> micro_batches;
  for (std::int64_t mbs = 1; mbs <= std::min<std::int64_t>(64, query.global_batch); ++mbs) {
    if (query.global_batch % mbs == 0 && (!fixed.micro_batch_size || *fixed.micro_batch_size == mbs)) {
      micro_batches.push_back(mbs);
    }
  }
  std::vector<int> tps;
  for (int tp = 1; tp <= query.cluster.devices_per_node; tp *= 2) {
    if (!fixed.tp || *fixed.tp == tp) tps.push_back(tp);
  }
  const LayerProfile profile =
      profile_layers(query.model, config.precision.dtype, micro_batches, tps, world.communicator());
  query.block_times = profile.block;
  query.head_times = profile.head;
  planner::PlanResult result;
  try {
    result = planner::search(query, fixed);
  } catch (const ConfigError& e) {
    throw ConfigError(mode + ": " + e.detail());
  }
  const planner::Candidate& chosen = result.ranked.front();
  Config planned = chosen.layout.apply_to(config, query.global_batch);
  for (const std::string& key : Config::plannable_keys()) {
    if (config.position_of(key).empty() || config.auto_keys.count(key)) planned.positions[key] = kChosen;
  }
  planned.auto_keys.clear();
  config = std::move(planned);

  std::ostringstream text;
  char figures[240];
  std::snprintf(figures, sizeof(figures),
                "%d node(s) x %d rank(s); each rank %.1f GFLOP/s (a %d^3 matmul), %.2f GB of memory; links %.2f GB/s, "
                "%.1f us (all-reduces of 1 MiB and 16 bytes)",
                query.cluster.nodes, query.cluster.devices_per_node, query.cluster.peak_flops / 1e9, 384,
                query.cluster.device_memory_bytes / 1e9, query.cluster.intra_bandwidth / 1e9,
                query.cluster.intra_latency * 1e6);
  text << "# auto layout (" << mode << "): " << query.model.describe() << ", global batch " << query.global_batch
       << "\n  measured: " << figures;
  std::snprintf(figures, sizeof(figures), "; memory %.1f GB/s; a block's forward + backward timed at %zu shape(s)",
                query.cluster.memory_bandwidth / 1e9, profile.block.size());
  text << figures;
  if (!fixed.describe().empty()) text << "\n  kept from the config: " << fixed.describe();
  text << "\n  chosen: " << planner::format_candidate(chosen) << planner::format_table(result, 5);
  std::snprintf(figures, sizeof(figures), "  (measuring and planning took %.2f s)\n", seconds_since(start));
  text << figures;
  return AutoLayout{text.str(), chosen.time.total * 1000.0, chosen.memory.device_total(), resident_bytes()};
}

}  // namespace parallax
