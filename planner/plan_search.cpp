// The planner's models and search (plan_search.h has the formulas in words).
#include "parallax/planner/plan_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/pipeline/partition.h"
#include "parallax/pipeline/schedule.h"
#include "parallax/planner/model_state.h"
#include "parallax/planner/strategy_matrix.h"

namespace parallax::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The pipeline's cut of [embeddings, blocks..., head] into pp × vp parts, as the
// engine's default partition ("parameters") makes it: by each layer's whole parameter
// count. Part q runs on stage q mod pp.
struct StageContents {
  std::int64_t elements = 0;  // parameter elements on one tensor-parallel rank
  std::int64_t blocks = 0;
  std::int64_t largest_layer = 0;  // elements of the largest layer on one tp rank
  bool embeddings = false;
  bool head = false;
};

std::vector<StageContents> stage_contents(const TransformerShape& model, int tp, int pp, int vp) {
  std::vector<double> weights;
  weights.push_back(static_cast<double>(model.embedding_parameters()));
  for (std::int64_t i = 0; i < model.layers; ++i) weights.push_back(static_cast<double>(model.block_parameters()));
  weights.push_back(static_cast<double>(model.head_parameters()));
  const std::vector<std::int64_t> cut = pipeline::balanced_boundaries(weights, pp * vp);
  std::vector<StageContents> stages(static_cast<std::size_t>(pp));
  const auto last = static_cast<std::int64_t>(weights.size()) - 1;
  for (int part = 0; part < pp * vp; ++part) {
    StageContents& stage = stages[static_cast<std::size_t>(part % pp)];
    for (std::int64_t layer = cut[static_cast<std::size_t>(part)]; layer < cut[static_cast<std::size_t>(part) + 1];
         ++layer) {
      std::int64_t elements = 0;
      if (layer == 0) {
        elements = model.embedding_parameters(tp);
        stage.embeddings = true;
      } else if (layer == last) {
        elements = model.head_parameters(tp);
        stage.head = true;
      } else {
        elements = model.block_parameters(tp);
        ++stage.blocks;
      }
      stage.elements += elements;
      stage.largest_layer = std::max(stage.largest_layer, elements);
    }
  }
  return stages;
}

// α–β ring collectives over `ranks` members on a link: all-reduce moves 2(n−1)/n of the
// bytes, reduce-scatter and all-gather (n−1)/n each.
double ring_seconds(double bytes, int ranks, double factor, double bandwidth, double latency) {
  if (ranks <= 1) return 0.0;
  const double n = ranks;
  return factor * (n - 1) / n * bytes / bandwidth + factor * (n - 1) * latency;
}

// Whether the group of `axis` (stride between its members, `size` members) spans more
// than one node of `per_node` devices.
bool crosses_nodes(int stride, int size, int per_node) {
  return size > 1 && static_cast<std::int64_t>(stride) * size > per_node;
}

// The schedule's makespan and bubble with unit costs (forward 1, backward 2 or 3 with
// recomputation; zb-h1's halves 1 and 1, or 2 and 1), from the engine's own schedules
// run together by the simulator; cached, since many candidates share a shape.
struct UnitPipeline {
  double makespan = 0;  // in units of one chunk's forward
  double busy = 0;      // the busiest stage's compute, same units
};

class PipelineCache {
 public:
  const std::vector<StageContents>& stages(const TransformerShape& model, int tp, int pp, int vp) {
    const auto key = std::make_tuple(tp, pp, vp);
    auto found = stages_.find(key);
    if (found != stages_.end()) return found->second;
    return stages_.emplace(key, stage_contents(model, tp, pp, vp)).first->second;
  }

  const UnitPipeline& get(PipelineSchedule kind, int pp, int m, int vp, bool recompute) {
    const auto key = std::make_tuple(static_cast<int>(kind), pp, m, vp, recompute);
    auto found = cache_.find(key);
    if (found != cache_.end()) return found->second;
    const pipeline::ScheduleShape shape{kind, pp, m, vp};
    UnitPipeline unit;
    pipeline::StageCosts costs;
    costs.forward = 1.0;
    costs.backward = recompute ? 3.0 : 2.0;
    costs.backward_input = recompute ? 2.0 : 1.0;
    costs.backward_weight = 1.0;
    if (pp == 1) {
      unit.makespan = m * vp * (costs.forward + costs.backward);
      unit.busy = unit.makespan;
    } else {
      const pipeline::Simulation simulation = pipeline::simulate(
          shape, pipeline::make_schedules(shape), std::vector<pipeline::StageCosts>(static_cast<std::size_t>(pp), costs));
      unit.makespan = simulation.makespan;
      unit.busy = *std::max_element(simulation.busy.begin(), simulation.busy.end());
    }
    return cache_.emplace(key, std::move(unit)).first->second;
  }

 private:
  std::map<std::tuple<int, int, int, int, bool>, UnitPipeline> cache_;
  std::map<std::tuple<int, int, int>, std::vector<StageContents>> stages_;  // one model per cache
};

// Why the model itself cannot take this split ("" when it can).
std::string model_refusal(const TransformerShape& model, const Layout& l) {
  const int kv_heads = static_cast<int>(model.kv_heads > 0 ? model.kv_heads : model.heads);
  if (model.heads % l.tp != 0 || kv_heads % l.tp != 0) {
    return "tp = " + std::to_string(l.tp) + " does not divide the model's " + std::to_string(model.heads) +
           " attention heads (" + std::to_string(kv_heads) + " for keys and values)";
  }
  if (model.ffn_width() % l.tp != 0 || model.vocab % l.tp != 0) {
    return "tp = " + std::to_string(l.tp) + " does not divide the MLP width " + std::to_string(model.ffn_width()) +
           " and the vocabulary " + std::to_string(model.vocab);
  }
  const std::int64_t layers = model.layers + 2;
  if (static_cast<std::int64_t>(l.pp) * l.virtual_stages > layers) {
    return "pp x vp = " + std::to_string(l.pp * l.virtual_stages) + " parts, but the model has " +
           std::to_string(layers) + " layers (embeddings, blocks, head)";
  }
  return "";
}

Candidate evaluate_with(const PlanQuery& query, const Layout& layout, PipelineCache& cache) {
  Candidate candidate;
  candidate.layout = layout;
  const Layout& l = layout;
  const ClusterSpec& cluster = query.cluster;
  const TransformerShape& model = query.model;
  const Config config = l.apply_to(query.base, query.global_batch);

  // Refused: the model cannot be split so, or the engine does not run it. A layout
  // refused by the engine is still predicted (what it would need), unless the model
  // cannot even be cut into its parts.
  candidate.refused = model_refusal(model, l);
  if (static_cast<std::int64_t>(l.pp) * l.virtual_stages > model.layers + 2) return candidate;
  if (candidate.refused.empty() && l.tp > 1 && query.tp_needs_plan && query.base.tensor_parallel.plan.empty()) {
    candidate.refused = "parallel.tp > 1 splits the model by a [tensor_parallel.plan], and the config has none";
  }
  if (candidate.refused.empty()) {
    try {
      check_sections(config);
      Config resolved = config;
      resolved.resolve(cluster.devices());
      const std::vector<Refusal> refusals = strategy_refusals(resolved);
      if (!refusals.empty()) candidate.refused = refusals.front().reason + "; instead: " + refusals.front().nearest;
    } catch (const Error& e) {
      candidate.refused = e.detail();
    }
  }

  // Memory per device: the stage that needs most.
  const int e = dtype_bytes(query.base.precision.dtype);
  const int k = optimizer_bytes_per_element(query.base.optimizer);
  const bool recompute = l.recompute == Recompute::kFull;
  const bool sp = query.base.tensor_parallel.sequence_parallel && l.tp > 1;
  const std::vector<StageContents>& stages = cache.stages(model, l.tp, l.pp, l.virtual_stages);
  const PipelineSchedule schedule = l.pp > 1 ? l.schedule : PipelineSchedule::k1F1B;
  const pipeline::ScheduleShape shape{schedule, l.pp, static_cast<int>(l.grad_accum), l.virtual_stages};
  OffloadOptions offload = query.base.offload;
  offload.optimizer = l.offload_optimizer;
  offload.param = l.offload_param;
  std::vector<ModelStateBytes> per_stage;
  for (int s = 0; s < l.pp; ++s) {
    const StageContents& stage = stages[static_cast<std::size_t>(s)];
    MemoryEstimate memory;
    memory.stage = s;
    memory.state = offloaded_model_state_formula(stage.elements, 0, l.dp, l.zero_stage, query.base.precision.dtype, k,
                                                 offload);
    // Activations: in-flight (micro-batch, chunk) pairs of this stage, each one chunk's.
    const double chunk_blocks = static_cast<double>(stage.blocks) / l.virtual_stages;
    const int in_flight = l.pp > 1 ? pipeline::activation_bound(shape, s) : 1;
    const double kept = recompute ? model.block_checkpoint_bytes(l.micro_batch_size, e, l.tp, sp)
                                  : model.block_activation_bytes(l.micro_batch_size, e, l.tp, sp);
    double activations = in_flight * chunk_blocks * kept;
    if (recompute && stage.blocks > 0) activations += model.block_activation_bytes(l.micro_batch_size, e, l.tp, sp);
    if (stage.head) activations += static_cast<double>(model.head_activation_bytes(l.micro_batch_size, l.tp));
    memory.activations = static_cast<std::int64_t>(activations);
    // Buffers: two gradient buckets, the pipeline's send and receive, ZeRO-3's gathered
    // layers (the live one and the prefetch).
    std::int64_t buffers = 0;
    if (l.dp > 1) buffers += 2 * std::min<std::int64_t>(query.base.zero.bucket_bytes(), 4 * stage.elements);
    if (l.pp > 1) buffers += 2 * 2 * l.micro_batch_size * model.seq * model.hidden * e;
    if (l.zero_stage == 3) buffers += 2 * e * stage.largest_layer;
    memory.buffers = buffers;
    per_stage.push_back(memory.state);
    if (s == 0 || memory.device_total() > candidate.memory.device_total()) candidate.memory = memory;
  }
  candidate.memory.state_per_stage = std::move(per_stage);
  const double limit = query.max_memory_bytes > 0 ? query.max_memory_bytes : cluster.usable_memory_bytes();
  if (static_cast<double>(candidate.memory.device_total()) > limit) {
    char text[160];
    std::snprintf(text, sizeof(text), "out of memory by %.2f GiB on stage %d of %d",
                  (static_cast<double>(candidate.memory.device_total()) - limit) / kGiB, candidate.memory.stage, l.pp);
    candidate.does_not_fit = text;
  }
  if (query.memory_only) return candidate;

  // Time per optimizer step.
  const double rate = cluster.peak_flops * cluster.achievable_fraction;
  const int per_node = cluster.devices_per_node;
  const bool tp_dp_pp = query.base.parallel.order == AxisOrder::kTpDpPp;
  const int dp_stride = tp_dp_pp ? l.tp : l.tp * l.pp;
  const int pp_stride = tp_dp_pp ? l.tp * l.dp : l.tp;
  const auto link = [&](bool across, double& bandwidth, double& latency) {
    bandwidth = across ? cluster.inter_bandwidth : cluster.intra_bandwidth;
    latency = across ? cluster.inter_latency : cluster.intra_latency;
  };
  double bw = 0, lat = 0;
  // One chunk's forward on the busiest stage: its blocks' matmuls, their tp all-reduces
  // (two per block forward, two backward: counted in the forward unit's 1 : 2), the head.
  link(crosses_nodes(1, l.tp, per_node), bw, lat);
  const double activation_bytes = static_cast<double>(l.micro_batch_size * model.seq * model.hidden * e);
  const double tp_allreduce = ring_seconds(activation_bytes, l.tp, 2.0, bw, lat);
  // A layer's "forward unit": a third of its forward and backward (the simulator's 1 : 2),
  // measured when the query has its times, else its operations at the achievable rate.
  const auto unit_of = [&](const LayerTimeTable& table, double estimate) {
    const auto found = table.find({l.micro_batch_size, l.tp});
    return found == table.end() ? estimate : (found->second.forward + found->second.backward) / 3.0;
  };
  const double block_unit = unit_of(
      query.block_times, model.block_forward_flops(l.micro_batch_size, l.tp) / rate + cluster.layer_overhead);
  const double head_unit = unit_of(query.head_times, model.head_forward_flops(l.micro_batch_size, l.tp) / rate);
  double busiest_forward = 0;
  double tp_share = 0;
  for (const StageContents& stage : stages) {
    const double blocks = static_cast<double>(stage.blocks) / l.virtual_stages;
    double forward = blocks * (block_unit + 2 * tp_allreduce);
    if (stage.head) forward += head_unit / l.virtual_stages;
    if (forward > busiest_forward) {
      busiest_forward = forward;
      tp_share = blocks * 2 * tp_allreduce;
    }
  }
  const UnitPipeline& unit = cache.get(schedule, l.pp, static_cast<int>(l.grad_accum), l.virtual_stages, recompute);
  TimeEstimate& time = candidate.time;
  time.pipeline = unit.makespan * busiest_forward;
  time.tensor_parallel = tp_share * unit.busy;
  time.bubble = unit.makespan > 0 ? 1.0 - unit.busy / unit.makespan : 0.0;
  if (l.pp > 1) {  // the first micro-batch's activations and the last one's gradients cross every stage boundary
    link(crosses_nodes(pp_stride, l.pp, per_node), bw, lat);
    time.pipeline += 2.0 * (l.pp - 1) * (activation_bytes / bw + lat);
  }
  // Data parallelism on the busiest stage's elements: what the last micro-batch's
  // backward does not hide.
  const StageContents& biggest = *std::max_element(
      stages.begin(), stages.end(), [](const StageContents& a, const StageContents& b) { return a.elements < b.elements; });
  const auto elements = static_cast<double>(biggest.elements);
  link(crosses_nodes(dp_stride, l.dp, per_node), bw, lat);
  const double last_backward = 2.0 * busiest_forward * l.virtual_stages;
  double reduce = 0;
  if (l.zero_stage == 0) {
    reduce = ring_seconds(4 * elements, l.dp, 2.0, bw, lat);
  } else {
    reduce = ring_seconds(4 * elements, l.dp, 1.0, bw, lat);  // reduce-scatter
    if (l.zero_stage < 3) reduce += ring_seconds(e * elements, l.dp, 1.0, bw, lat);  // the step's all-gather
  }
  time.data_parallel = std::max(0.0, reduce - last_backward);
  if (l.zero_stage == 3) {  // gathered for the forward and again for the backward of every micro-batch
    const double gathers = 2.0 * ring_seconds(e * elements, l.dp, 1.0, bw, lat);
    const double compute = 3.0 * busiest_forward * l.virtual_stages;
    time.data_parallel += l.grad_accum * std::max(0.0, gathers - compute) + reduce;
  }
  // The optimizer step over this rank's shard: the device's memory traffic (parameter,
  // fp32 gradient, master and moments read and written), or the host's Adam and PCIe.
  const double shard = l.zero_stage == 0 ? elements : elements / l.dp;
  if (l.offload_optimizer == OffloadTarget::kNone) {
    time.optimizer = shard * 2.0 * (e + 4 + (e < 4 ? 4 : 0) + k) / cluster.memory_bandwidth;
  } else {
    time.optimizer = shard / cluster.host_adam_elements_per_second + shard * (4.0 + e) / cluster.host_bandwidth;
  }
  time.total = time.pipeline + time.data_parallel + time.optimizer;
  time.mfu = model.model_flops(query.global_batch) / (time.total * cluster.devices() * cluster.peak_flops);
  return candidate;
}

}  // namespace

Candidate evaluate(const PlanQuery& query, const Layout& layout) {
  PipelineCache cache;
  return evaluate_with(query, layout, cache);
}

namespace {

std::vector<int> divisors(std::int64_t n, std::int64_t limit) {
  std::vector<int> out;
  for (std::int64_t d = 1; d <= std::min(n, limit); ++d) {
    if (n % d == 0) out.push_back(static_cast<int>(d));
  }
  return out;
}

bool better(const Candidate& a, const Candidate& b, Preference preference) {
  if (preference == Preference::kMemory || (a.time.total == 0 && b.time.total == 0)) {
    if (a.memory.device_total() != b.memory.device_total()) return a.memory.device_total() < b.memory.device_total();
    return a.time.total < b.time.total;
  }
  if (a.time.total != b.time.total) return a.time.total < b.time.total;
  return a.memory.device_total() < b.memory.device_total();
}

// The families the rejection lines speak of.
std::string family_of(const Layout& l) {
  return "tp=" + std::to_string(l.tp) + ",pp=" + std::to_string(l.pp);
}

}  // namespace

std::vector<Layout> enumerate_layouts(const PlanQuery& query, const LayoutConstraints& constraints) {
  const int devices = query.cluster.devices();
  std::vector<Layout> layouts;
  for (int tp = 1; tp <= query.cluster.devices_per_node && tp <= devices; tp *= 2) {
    if (devices % tp != 0) continue;
    for (int pp : divisors(devices / tp, query.model.layers + 2)) {
      const int dp = devices / (tp * pp);
      if (query.global_batch % dp != 0) continue;
      const std::int64_t per_replica = query.global_batch / dp;
      for (int mbs : divisors(per_replica, 64)) {
        for (int zero = 0; zero <= 3; ++zero) {
          for (int offload = 0; offload <= (zero == 0 ? 0 : zero == 3 ? 2 : 1); ++offload) {
            struct Pipe {
              PipelineSchedule schedule;
              int vp;
            };
            std::vector<Pipe> pipes{{PipelineSchedule::k1F1B, 1}};
            if (pp > 1) {
              pipes = {{PipelineSchedule::kGPipe, 1}, {PipelineSchedule::k1F1B, 1}, {PipelineSchedule::kZbH1, 1}};
              for (int vp : {2, 4}) pipes.push_back({PipelineSchedule::kInterleaved, vp});
            }
            for (const Pipe& pipe : pipes) {
              for (Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
                if (pp == 1 && recompute == Recompute::kFull) continue;  // pipeline.recompute is the pipeline's
                Layout l;
                l.tp = tp;
                l.pp = pp;
                l.dp = dp;
                l.zero_stage = zero;
                l.offload_optimizer = offload >= 1 ? OffloadTarget::kCpu : OffloadTarget::kNone;
                l.offload_param = offload == 2 ? OffloadTarget::kCpu : OffloadTarget::kNone;
                l.schedule = pipe.schedule;
                l.virtual_stages = pipe.vp;
                l.recompute = recompute;
                l.micro_batch_size = mbs;
                l.grad_accum = per_replica / mbs;
                if (constraints.admits(l)) layouts.push_back(l);
              }
            }
          }
        }
      }
    }
  }
  return layouts;
}

PlanResult search(const PlanQuery& query, const LayoutConstraints& constraints) {
  const auto start = std::chrono::steady_clock::now();
  PARALLAX_CHECK(query.global_batch >= 1, UsageError, "the global batch must be at least 1 sample, got ",
                 query.global_batch);
  PipelineCache cache;
  PlanResult result;
  std::map<std::string, std::string> refused;  // family -> its first refusal
  std::map<std::string, bool> family_runs;
  std::vector<Candidate> over_memory;
  for (const Layout& layout : enumerate_layouts(query, constraints)) {
    Candidate candidate = evaluate_with(query, layout, cache);
    ++result.scored;
    const std::string family = family_of(layout);
    if (candidate.runs()) {
      family_runs[family] = true;
      result.ranked.push_back(std::move(candidate));
    } else if (!candidate.refused.empty()) {
      refused.emplace(family, candidate.refused);
    } else {
      over_memory.push_back(std::move(candidate));
    }
  }
  std::stable_sort(result.ranked.begin(), result.ranked.end(),
                   [&](const Candidate& a, const Candidate& b) { return better(a, b, query.preference); });
  // Each family with nothing that runs and fits: its layout over memory by least, else
  // why the engine refuses it.
  std::map<std::string, const Candidate*> least_over;
  for (const Candidate& c : over_memory) {
    const Candidate*& best = least_over[family_of(c.layout)];
    if (best == nullptr || c.memory.device_total() < best->memory.device_total()) best = &c;
  }
  for (const auto& [family, over] : least_over) {
    if (!family_runs[family]) {
      result.rejected.push_back(family + ": " + over->does_not_fit + " at best (" + over->layout.describe() + ")");
    }
  }
  // Refusals: one line per reason, naming its families.
  std::map<std::string, std::string> families_by_reason;
  for (const auto& [family, reason] : refused) {
    if (family_runs[family] || least_over.count(family)) continue;
    std::string& families = families_by_reason[reason];
    families += (families.empty() ? "" : " ") + family;
  }
  for (const auto& [reason, families] : families_by_reason) result.rejected.push_back(families + ": " + reason);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.ranked.empty()) {
    const Candidate* nearest = nullptr;
    for (const Candidate& c : over_memory) {
      if (nearest == nullptr || c.memory.device_total() < nearest->memory.device_total()) nearest = &c;
    }
    std::string text = "no layout of " + std::to_string(query.cluster.devices()) + " devices runs and fits";
    if (!constraints.describe().empty()) text += " with " + constraints.describe();
    text += " (" + std::to_string(result.scored) + " scored)";
    if (result.scored == 0) {
      text += "; the layouts a world of " + std::to_string(query.cluster.devices()) +
              " admits have tp a power of two up to a node's " + std::to_string(query.cluster.devices_per_node) +
              " devices, pp dividing the rest, and dp dividing the global batch of " +
              std::to_string(query.global_batch);
    } else if (nearest != nullptr) {
      text += "; the nearest is " + nearest->layout.describe() + ", " + nearest->does_not_fit;
    } else if (!result.rejected.empty()) {
      text += "; " + result.rejected.front();
    }
    throw ConfigError(text);
  }
  return result;
}

std::size_t rank_among(const PlanResult& result, const Candidate& candidate, Preference preference) {
  if (!candidate.runs()) return 0;
  std::size_t rank = 1;
  for (const Candidate& other : result.ranked) {
    if (better(other, candidate, preference)) ++rank;
  }
  return rank;
}

}  // namespace parallax::planner
