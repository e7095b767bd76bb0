#include "parallax/runtime/auto_layout.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "parallax/core/error.h"
#include "parallax/core/resident_memory.h"
#include "parallax/core/world.h"
#include "parallax/planner/plan_search.h"
#include "parallax/planner/strategy_matrix.h"
#include "parallax/runtime/layer_profile.h"

namespace parallax {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Nodes of this run: emulated ones, or the hosts the world spans.
int node_count(const Config& config, const World& world) {
  return config.topology.emulate_nodes > 0 ? static_cast<int>(config.topology.emulate_nodes)
                                           : std::max(1, world.size() / std::max(1, world.local_size()));
}

// This machine as the planner sees it: the profile's figures (rank 0's, shared), its
// peak the best rate a profiled block reached.
planner::ClusterSpec this_cluster(const Config& config, const World& world, const LayerProfile& profile,
                                  const planner::TransformerShape& model) {
  const planner::MeasuredProfile& m = profile.measured;
  planner::ClusterSpec cluster = planner::ClusterSpec::preset("cpu", 1);
  cluster.name = "this machine";
  cluster.nodes = node_count(config, world);
  cluster.devices_per_node = std::max(1, world.size() / cluster.nodes);
  const double host_memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  cluster.device_memory_bytes = host_memory / std::max(1, world.local_size());
  double peak = 0;
  for (const auto& [shape, times] : m.block) {
    peak = std::max(peak, 3.0 * model.block_forward_flops(shape.first, shape.second) / (times.forward + times.backward));
  }
  if (peak > 0) cluster.peak_flops = peak;
  cluster.achievable_fraction = 1.0;  // measured, not a datasheet's
  cluster.memory_bandwidth = m.memory_bandwidth;
  cluster.host_bandwidth = m.memory_bandwidth;
  cluster.host_adam_elements_per_second = m.memory_bandwidth / 32.0;  // parameter, gradient, two moments read and written
  if (world.size() > 1) {
    // Between nodes as measured between the hosts MPI found; on one host (emulated nodes
    // included) the link within it stands for both.
    const bool between_measured = m.inter_node_link_bandwidth > 0;
    cluster.intra_bandwidth = m.link_bandwidth > 0 ? m.link_bandwidth : m.inter_node_link_bandwidth;
    cluster.intra_latency = m.link_bandwidth > 0 ? m.link_latency : m.inter_node_link_latency;
    cluster.inter_bandwidth = between_measured ? m.inter_node_link_bandwidth : cluster.intra_bandwidth;
    cluster.inter_latency = between_measured ? m.inter_node_link_latency : cluster.intra_latency;
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

}  // namespace

Malloc this_malloc() {
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return Malloc::kTcmalloc;
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return Malloc::kJemalloc;
  return Malloc::kGlibc;
}

const char* to_string(Malloc malloc) {
  switch (malloc) {
    case Malloc::kTcmalloc: return "tcmalloc";
    case Malloc::kJemalloc: return "jemalloc";
    case Malloc::kGlibc: break;
  }
  return "glibc malloc";
}

void release_free_memory() {
  switch (this_malloc()) {
    case Malloc::kTcmalloc:
      if (auto release = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"))) {
        release();
      }
      return;
    case Malloc::kJemalloc:  // "arena.4096" is every arena (MALLCTL_ARENAS_ALL)
      reinterpret_cast<int (*)(const char*, void*, std::size_t*, void*, std::size_t)>(dlsym(
          RTLD_DEFAULT, "mallctl"))("arena.4096.purge", nullptr, nullptr, nullptr, 0);
      return;
    case Malloc::kGlibc:
      malloc_trim(0);
      return;
  }
}

AutoLayout choose_auto_layout(Config& config, World& world) {
  if (config.parallel.mode != ParallelMode::kAuto && config.auto_keys.empty()) return {};
  // The planner does not model context parallelism: the matrix's refusal, before it
  // plans a layout without cp's ranks.
  if (config.parallel.cp > 1) check_strategy(config);
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
  for (int tp = 1; tp <= std::max(1, world.size() / node_count(config, world)); tp *= 2) {
    if (!fixed.tp || *fixed.tp == tp) tps.push_back(tp);
  }
  const LayerProfile profile = profile_layers(query.model, config.precision.dtype, micro_batches, tps,
                                              config.automatic.profile_cache, world);
  // The memory check's baseline: after the profiling, its freed buffers given back to
  // the system (a caching malloc would keep them for training to reuse, or not) and its
  // peak forgotten, so a run that profiles and one that reads the file measure alike.
  release_free_memory();
  const std::int64_t resident_before = resident_bytes();
  reset_resident_peak();
  query.cluster = this_cluster(config, world, profile, query.model);
  query.block_times = profile.measured.block;
  query.head_times = profile.measured.head;
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
  char figures[320];
  std::snprintf(figures, sizeof(figures),
                "%d node(s) x %d rank(s); each rank %.1f GFLOP/s (the best block), %.2f GB of memory, memory "
                "%.1f GB/s; links %.2f GB/s, %.1f us within a node, %.2f GB/s, %.1f us between nodes "
                "(all-reduces of 1 MiB and 16 bytes)",
                query.cluster.nodes, query.cluster.devices_per_node, query.cluster.peak_flops / 1e9,
                query.cluster.device_memory_bytes / 1e9, query.cluster.memory_bandwidth / 1e9,
                query.cluster.intra_bandwidth / 1e9, query.cluster.intra_latency * 1e6,
                query.cluster.inter_bandwidth / 1e9, query.cluster.inter_latency * 1e6);
  text << "# auto layout (" << mode << "): " << query.model.describe() << ", global batch " << query.global_batch
       << "\n  measured: " << figures;
  std::snprintf(figures, sizeof(figures),
                "; a block's and the head's forward + backward at %zu shape(s): %zu timed, %zu read from ",
                profile.timed + profile.from_file, profile.timed, profile.from_file);
  text << figures << (profile.file.empty() ? std::string("no file (auto.profile_cache = \"none\")") : profile.file);
  if (profile.machine_from_file) text << " (with the memory and link figures)";
  if (!profile.cache_problem.empty()) text << "\n  layer-time file not used: " << profile.cache_problem;
  if (!fixed.describe().empty()) text << "\n  kept from the config: " << fixed.describe();
  text << "\n  chosen: " << planner::format_candidate(chosen) << planner::format_table(result, 5);
  AutoLayout chosen_layout;
  chosen_layout.model_step_ms = chosen.time.total * 1000.0;
  chosen_layout.step_time_correction = profile.step_time_correction;
  chosen_layout.predicted_bytes = chosen.memory.device_total();
  chosen_layout.profile_file = profile.file;
  if (profile.correction_runs > 0) {
    std::snprintf(figures, sizeof(figures),
                  "  predicted step time: %.2f ms = the model's %.2f ms x %.3f, the median measured / predicted of "
                  "the last %zu run(s) in the layer-time file\n",
                  chosen_layout.predicted_step_ms(), chosen_layout.model_step_ms, profile.step_time_correction,
                  profile.correction_runs);
    text << figures;
  }
  std::snprintf(figures, sizeof(figures), "  (measuring and planning took %.2f s)\n", seconds_since(start));
  text << figures;
  chosen_layout.explanation = text.str();
  chosen_layout.resident_bytes = resident_before;
  return chosen_layout;
}

}  // namespace parallax
