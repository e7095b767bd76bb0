// The planner: every layout of a transformer on a cluster that this build runs, its
// memory per device and its step time predicted, ranked. A layout is one choice of
// tp × pp × dp, ZeRO stage, offload, pipeline schedule and virtual stages,
// recomputation, micro-batch size and accumulation. Each candidate is turned into the
// Config it stands for and checked by the loader's section checks and the strategy
// matrix (strategy_refusals), so the planner never proposes what the engine refuses.
//
//   planner::PlanQuery query{shape, cluster, global_batch, base_config};
//   planner::PlanResult result = planner::search(query, planner::LayoutConstraints::parse("tp=8"));
//   std::cout << planner::format_table(result, 10);
//
// Memory per device, on the stage that needs most:
//   model state: offloaded_model_state_formula() over the stage's parameter elements
//     (the pipeline's uniform partition of [embeddings, blocks..., head], each split
//     by tp as TransformerShape says), padding not counted (below dp per buffer);
//   activations: per in-flight micro-batch (activation_bound() of the schedule) the
//     blocks' bytes by TransformerShape (with full recomputation their inputs, plus one
//     block's whole activations while it is recomputed), the head's logits;
//   buffers: two gradient buckets (zero.bucket_mb) when dp > 1, the pipeline's send and
//     receive buffers, at ZeRO-3 two gathered layers (the live one and the prefetch).
// Time per optimizer step:
//   compute: operations / (peak × achievable_fraction) plus the cluster's fixed cost
//     per layer and micro-batch, tensor-parallel all-reduces (two forward, two backward
//     per block) over the node's links; the pipeline's makespan is the busiest stage's
//     chunk forward times simulate()'s makespan of the engine's schedules in units of
//     it (forward 1, backward 2, 3 with recomputation), plus the first activation's and
//     last gradient's trips across the stages;
//   data parallelism: the gradient reduction (ring all-reduce or reduce-scatter of
//     fp32 gradients) less the last micro-batch's backward it overlaps, ZeRO-1/2's
//     parameter all-gather after the step, ZeRO-3's gathers per micro-batch beyond the
//     compute they overlap; links inside or across nodes as the mesh places the group;
//   optimizer: the device's memory traffic, or offload's host Adam and PCIe copies.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/core/model_state_bytes.h"
#include "parallax/planner/cluster_spec.h"
#include "parallax/planner/transformer_shape.h"

namespace parallax::planner {

/// Every choice the planner makes for one run.
struct Layout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int zero_stage = 0;
  OffloadTarget offload_optimizer = OffloadTarget::kNone;
  OffloadTarget offload_param = OffloadTarget::kNone;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int virtual_stages = 1;
  Recompute recompute = Recompute::kNone;
  std::int64_t micro_batch_size = 1;
  std::int64_t grad_accum = 1;

  /// "tp=8,pp=16,dp=12,zero=1,offload=none,schedule=1f1b,vp=1,recompute=full,mbs=1,ga=128"
  std::string describe() const;
  /// The Config this layout stands for: `base` with these keys set (mode manual).
  Config apply_to(const Config& base, std::int64_t global_batch) const;
};

/// `text` as a whole number in [low, 2^40]; otherwise UsageError "<what>: expected a whole
/// number of at least <low>" (the layout items and parallax plan's flags).
std::int64_t parse_whole_number(const std::string& text, std::int64_t low, const std::string& what);

/// Layout keys a user fixed; the planner chooses the rest.
struct LayoutConstraints {
  std::optional<int> tp, pp, dp, zero_stage, virtual_stages;
  std::optional<OffloadTarget> offload_optimizer, offload_param;
  std::optional<PipelineSchedule> schedule;
  std::optional<Recompute> recompute;
  std::optional<std::int64_t> micro_batch_size, grad_accum;

  /// From "tp=8,pp=16,dp=128,zero=1,offload=optimizer+param,schedule=interleaved,vp=4,
  /// recompute=full,mbs=1,ga=8" (any subset, in any order; offload = none | optimizer |
  /// optimizer+param, each "cpu"; "nvme" tiers are not planned). Throws UsageError
  /// naming the item and what is allowed.
  static LayoutConstraints parse(const std::string& text);
  bool admits(const Layout& layout) const;
  std::string describe() const;
};

struct MemoryEstimate {
  int stage = 0;  ///< the pipeline stage that needs most
  ModelStateBytes state;
  std::int64_t activations = 0;
  std::int64_t buffers = 0;
  /// Model state of every stage (index = pipeline stage): what --explain measures per rank.
  std::vector<ModelStateBytes> state_per_stage;
  std::int64_t device_total() const { return state.params + state.grads + state.optimizer + activations + buffers; }
};

struct TimeEstimate {  ///< seconds per optimizer step
  double pipeline = 0;         ///< the pipeline's makespan: compute, tp all-reduces, transfers, bubble
  double tensor_parallel = 0;  ///< the tp all-reduces inside it (one stage's share)
  double bubble = 0;           ///< fraction of the makespan the busiest stage idles
  double data_parallel = 0;    ///< exposed reduction and gathers
  double optimizer = 0;        ///< the step, on the device or on the host
  double total = 0;
  double mfu = 0;              ///< model operations / (total × devices × peak)
};

struct Candidate {
  Layout layout;
  MemoryEstimate memory;
  TimeEstimate time;
  std::string refused;       ///< why the engine refuses it (loader or strategy matrix), or ""
  std::string does_not_fit;  ///< "out of memory by 3.2 GiB on stage 0 of 4", or ""
  bool runs() const { return refused.empty() && does_not_fit.empty(); }
};

enum class Preference { kThroughput, kMemory };

/// Seconds of one layer's forward and backward for one micro-batch on one rank.
struct LayerTimes {
  double forward = 0;
  double backward = 0;
};
/// Layer times by (micro-batch size, tp).
using LayerTimeTable = std::map<std::pair<std::int64_t, int>, LayerTimes>;

struct PlanQuery {
  TransformerShape model;
  ClusterSpec cluster;
  std::int64_t global_batch = 0;
  /// Optimizer, precision, device, backend, tensor_parallel and the rest a candidate
  /// keeps; its layout keys are replaced by each candidate's.
  Config base;
  double max_memory_bytes = 0;  ///< per device; 0 = cluster.usable_memory_bytes()
  Preference preference = Preference::kThroughput;
  /// Measured times of one block and of the head with its loss (e.g. profiled on this
  /// machine, runtime/layer_profile.h): for the shapes they hold they replace the
  /// operations-over-peak estimate and the cluster's layer_overhead.
  LayerTimeTable block_times, head_times;
  /// Whether tp > 1 needs base.tensor_parallel.plan: true for a run's own model (the
  /// planner cannot see whether it is built from tensor_parallel/ layers), false for a
  /// published model, taken as built for tensor parallelism.
  bool tp_needs_plan = false;
  /// Predict memory only (no pipeline simulation, times 0; ranked by memory): what a
  /// question of fit asks (parallax plan --largest-model), much faster.
  bool memory_only = false;
};

struct PlanResult {
  std::vector<Candidate> ranked;       ///< candidates that run and fit, best first
  std::vector<std::string> rejected;   ///< one line per family (tp, pp, ZeRO, offload) with none that runs
  std::int64_t scored = 0;             ///< candidates enumerated and scored
  double seconds = 0;                  ///< the search's own time
};

/// Predicts one layout: refused (why), fits or not (by how much), memory and time.
Candidate evaluate(const PlanQuery& query, const Layout& layout);

/// The layouts search() scores (see below), in a fixed order.
std::vector<Layout> enumerate_layouts(const PlanQuery& query, const LayoutConstraints& constraints);

/// Every layout `constraints` admits, on query.cluster.devices() ranks: tp a power of
/// two up to a node's devices dividing the heads; pp dividing the blocks into equal
/// parts; dp the rest (dividing the global batch); micro-batch sizes dividing the
/// per-replica batch; ZeRO 0–3; offload none, optimizer, optimizer + parameters (on
/// the host); for pp > 1 the four schedules with 2 and 4 virtual stages where they
/// divide; recomputation none or full. Throws ConfigError when none runs and fits,
/// naming the constraints and the nearest layout (the one over memory by least).
PlanResult search(const PlanQuery& query, const LayoutConstraints& constraints);

/// Rank of `candidate` (1-based) among `result`'s, by the query's preference; 0 when
/// it does not run or fit.
std::size_t rank_among(const PlanResult& result, const Candidate& candidate, Preference preference);

/// The `top` best as a table (layout, memory per device and its parts, step time and
/// its parts, MFU), then the rejected families.
std::string format_table(const PlanResult& result, std::size_t top);
/// One candidate in words: its layout, memory parts and time parts, refusal or fit.
std::string format_candidate(const Candidate& candidate);
/// One candidate as JSON (the objects of format_json's "candidates"), with its `rank`
/// among the plans that run and fit (0: it does not).
std::string format_candidate_json(const Candidate& candidate, std::size_t rank);
/// The result as JSON: {"scored", "seconds", "candidates": [{layout keys, "memory":
/// {...}, "time": {...}}], "rejected": [...]}, the `top` best.
std::string format_json(const PlanResult& result, std::size_t top);

}  // namespace parallax::planner
