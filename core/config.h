// Typed configuration: one options struct per TOML section.
//
// The loader (config_loader.h) turns TOML files and `--set` overrides into a Config;
// nothing below the loader sees TOML. Field names are the TOML key names; each field
// documents its meaning, unit and default. See ../shared/DESIGN.md for the vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "parallax/core/logging.h"

namespace parallax {

/// [train]: batch arithmetic and run length.
/// global_batch_size = micro_batch_size × grad_accum × dp, exactly; one may be omitted
/// (0 here) and is inferred by Config::resolve.
enum class TrainDevice { kCpu, kCuda };

struct TrainOptions {
  /// Samples per optimizer step over all data-parallel ranks, e.g. 32. Default: inferred.
  std::int64_t global_batch_size = 0;
  /// Samples per rank per micro-step, e.g. 4. Default: inferred.
  std::int64_t micro_batch_size = 0;
  /// Micro-steps per optimizer step (= pipeline micro-batches). Default: inferred.
  std::int64_t grad_accum = 0;
  /// Optimizer steps to run. Default: 100.
  std::int64_t steps = 100;
  /// Seed of LibTorch's default generator on every rank (set by parallax::init), so
  /// models built after init start identical; data order is the application's.
  /// Default: 1234.
  std::int64_t seed = 1234;
  /// cpu | cuda: where the engine trains the model (it moves the model there, and each
  /// input). cuda: each rank takes its GPU (the one hwloc places nearest its cores when
  /// the node shows GPUs, else local rank order) and its groups carry CUDA tensors over
  /// NCCL, host tensors over MPI. Default: cpu.
  TrainDevice device = TrainDevice::kCpu;
};

enum class OptimizerType { kSgd, kAdam, kAdamW, kRmsprop, kAdagrad };

/// Whether `type` is Adam or AdamW (what the fused and the offloaded CPU step run).
inline bool is_adam_family(OptimizerType type) {
  return type == OptimizerType::kAdam || type == OptimizerType::kAdamW;
}

/// [optimizer]: LibTorch's optimizer of that type, with these options (the keys of
/// another type must stay at their defaults).
struct OptimizerOptions {
  /// sgd | adam | adamw | rmsprop | adagrad. Default: adamw.
  OptimizerType type = OptimizerType::kAdamW;
  /// Peak learning rate. Default: 3e-4.
  double lr = 3e-4;
  /// Adam betas. Default: [0.9, 0.999].
  std::array<double, 2> betas{0.9, 0.999};
  /// Epsilon added to the denominator (adam, adamw, rmsprop, adagrad). Default: 1e-8.
  double eps = 1e-8;
  /// L2 (sgd, adam, rmsprop, adagrad) or decoupled (adamw) weight decay. Default: 0.
  double weight_decay = 0.0;
  /// Momentum (sgd, rmsprop). Default: 0.
  double momentum = 0.0;
  /// SGD: dampening of the momentum. Default: 0.
  double dampening = 0.0;
  /// SGD: Nesterov momentum (needs momentum > 0 and dampening = 0). Default: false.
  bool nesterov = false;
  /// Adam, AdamW: keep the running maximum of the second moments (AMSGrad). Default: false.
  bool amsgrad = false;
  /// RMSprop: smoothing constant of the squared-gradient average, e.g. 0.99. Default: 0.99.
  double alpha = 0.99;
  /// RMSprop: divide by the centered second moment (the gradient's variance). Default: false.
  bool centered = false;
  /// Adagrad: step k (from 1) uses lr / (1 + (k - 1) x lr_decay). Default: 0.
  double lr_decay = 0.0;
  /// Adagrad: the starting value of the squared-gradient sums. Default: 0.
  double initial_accumulator_value = 0.0;
  /// Global-norm gradient clipping threshold; 0 = off. Default: 0.
  double grad_clip = 0.0;
  /// Parameters exempt from weight decay, by kind: "bias" (parameters named bias),
  /// "norm" (normalization layers' parameters, and every other 1-D parameter but a
  /// bias), "embedding" (embedding tables), e.g. ["bias", "norm", "embedding"] (the GPT
  /// recipe of nanoGPT and Megatron). They form a parameter group of weight_decay 0.
  /// Default: [] (every parameter decays).
  std::vector<std::string> no_decay;
};

enum class SchedulerType { kConstant, kLinear, kCosine };

/// [scheduler]: learning rate over optimizer steps.
struct SchedulerOptions {
  /// constant | linear | cosine (decay to min_lr at train.steps). Default: constant.
  SchedulerType type = SchedulerType::kConstant;
  /// Steps of linear warmup: step k (0-based) uses lr × (k + 1) / warmup_steps.
  /// Default: 0.
  std::int64_t warmup_steps = 0;
  /// Floor reached at the end of linear/cosine decay. Default: 0.
  double min_lr = 0.0;
};

enum class Dtype { kFp32, kBf16, kFp16 };

/// [precision]
struct PrecisionOptions {
  /// fp32 | bf16 | fp16. bf16 and fp16 keep fp32 master weights; fp16 also scales the
  /// loss dynamically (the loss_scale_* keys). Default: fp32.
  Dtype dtype = Dtype::kFp32;
  /// fp16: the first loss scale. Default: 65536 (2^16).
  double loss_scale_initial = 65536.0;
  /// fp16: steps without overflow after which the scale doubles. Default: 1000.
  std::int64_t loss_scale_growth_interval = 1000;
  /// fp16: factor applied to the scale when an overflow exhausts the hysteresis.
  /// Default: 0.5.
  double loss_scale_backoff = 0.5;
  /// fp16: consecutive overflowing steps tolerated before the scale backs off (every
  /// overflowing step is skipped). Default: 2.
  std::int64_t loss_scale_hysteresis = 2;
  /// fp16: the smallest scale; an overflow that would go below it is an error
  /// (training has diverged). Default: 1.
  double loss_scale_min = 1.0;
};

enum class ParallelMode { kManual, kAuto };

/// Which mesh axis varies fastest over world ranks, innermost first ([parallel] order).
/// Tensor parallelism is always innermost (it must stay inside a node); the outermost
/// axis is the one that crosses nodes first.
enum class AxisOrder {
  kTpDpPp,  ///< "tp-dp-pp": pipeline stages outermost (Megatron's order)
  kTpPpDp,  ///< "tp-pp-dp": data-parallel replicas outermost (a whole pipeline per node)
};

/// [parallel]: degrees; tp × pp × dp = world size.
struct ParallelOptions {
  /// manual | auto. Default: manual.
  ParallelMode mode = ParallelMode::kManual;
  /// Tensor-parallel degree. Default: 1.
  int tp = 1;
  /// Pipeline-parallel degree. Default: 1.
  int pp = 1;
  /// Context-parallel degree: ranks each sequence is split over ([context_parallel]);
  /// the axis after tp, inside a node. Default: 1.
  int cp = 1;
  /// Data-parallel degree; -1 = world size / (tp × pp × cp). Default: -1.
  int dp = -1;
  /// Expert-parallel degree: ranks that share out each mixture-of-experts layer's
  /// experts, folded inside the dp × cp replicas (must divide dp × cp). Default: 1.
  int ep = 1;
  /// Mesh axes innermost first: "tp-dp-pp" puts pipeline stages across nodes first,
  /// "tp-pp-dp" data-parallel replicas. Default: "tp-dp-pp".
  AxisOrder order = AxisOrder::kTpDpPp;
};

/// [zero]: how model state is sharded over the data-parallel group.
struct ZeroOptions {
  /// 0 = plain data parallelism; 1 = optimizer state sharded; 2 = also gradients;
  /// 3 = also parameters. Default: 0.
  int stage = 0;
  /// Gradient bucket size in MiB; buckets are reduced as they fill. Stages 1–2: also
  /// the size of one flat, sharded buffer. Default: 25.
  double bucket_mb = 25.0;
  /// Launch bucket reductions during backward. Default: true.
  bool overlap_comm = true;
  /// Stage 3: MiB of parameters gathered ahead of use, in the recorded execution
  /// order. 0 = gather only on use. Default: 32.
  double prefetch_mb = 32.0;
  /// Stage 3: parameters with at most this many elements are not sharded; they stay
  /// gathered on every rank (their gradients are still reduce-scattered). 0 = shard
  /// everything. Default: 0.
  std::int64_t persistence_threshold = 0;
  /// Stage 3: MiB of gathered units kept while the forward runs; the least recently
  /// used unit is released beyond it (the unit in use is always kept, so the peak is
  /// at most this plus one unit plus prefetch). Default: 1024.
  double max_live_mb = 1024.0;
  /// Stage 3: release every unit but the forward's last when the forward ends and gather
  /// again in backward (true), or keep them gathered until their backward (false: less
  /// communication, more memory). Default: true.
  bool reshard_after_forward = true;
  /// Stage 3: release each unit when its backward is done (true), or keep it gathered
  /// until the optimizer step (false). With reshard_after_forward = false too, a unit is
  /// gathered once per optimizer step instead of once or twice per micro-batch (what a
  /// pipeline's many micro-batches want), holding the stage's whole parameters during
  /// the step. Default: true.
  bool reshard_after_backward = true;
  /// Stage 3: module type names (Module::name(), e.g. "BlockImpl"; the "Impl" suffix
  /// may be omitted) whose instances become units: gathered and released together.
  /// Parameters of no unit belong to the root unit. Default: none.
  std::vector<std::string> wrap;
  /// Stage 3: a module whose parameters not yet in a unit number at least this many
  /// becomes a unit too; 0 = off. Default: 0.
  std::int64_t wrap_min_params = 0;

  /// bucket_mb in bytes.
  std::int64_t bucket_bytes() const { return megabytes_to_bytes(bucket_mb); }
  std::int64_t prefetch_bytes() const { return megabytes_to_bytes(prefetch_mb); }
  std::int64_t max_live_bytes() const { return megabytes_to_bytes(max_live_mb); }

 private:
  static std::int64_t megabytes_to_bytes(double mb) { return static_cast<std::int64_t>(mb * 1024.0 * 1024.0); }
};

enum class OffloadTarget { kNone, kCpu, kNvme };

/// [offload]: ZeRO-Offload / ZeRO-Infinity. Where the sharded model state lives.
struct OffloadOptions {
  /// none | cpu | nvme: the fp32 master shard and Adam moments in host memory, the
  /// step run by the fused CPU Adam (cpu); the moments in files under nvme_path,
  /// streamed through host buffers (nvme). Needs zero.stage >= 1 and Adam/AdamW.
  /// Default: none.
  OffloadTarget optimizer = OffloadTarget::kNone;
  /// none | cpu | nvme (zero.stage = 3, with the optimizer offloaded): no persistent
  /// parameter shard on the device; a unit's gather fetches this rank's part from the
  /// host master (cpu) or from its file (nvme, which needs optimizer = "nvme").
  /// Default: none.
  OffloadTarget param = OffloadTarget::kNone;
  /// Host buffers the device copies to and from are page-locked (CUDA tensors only;
  /// CPU training ignores it). Default: true.
  bool pin_memory = true;
  /// Directory of the NVMe tier's files (one per rank, deleted as soon as it is
  /// opened, so nothing is left behind after any exit). Default: "" (required for nvme).
  std::string nvme_path;
  /// MiB of one host buffer of the NVMe tier: the moments (and, with param = "nvme",
  /// the master) of one tile of parameters. Default: 64.
  double buffer_mb = 64.0;
  /// Host buffers of the NVMe tier, >= 2: with 2, reading tile k+1 and writing tile
  /// k-1 overlap updating tile k; more read further ahead. Default: 4.
  std::int64_t buffer_count = 4;

  bool optimizer_offloaded() const { return optimizer != OffloadTarget::kNone; }
  std::int64_t buffer_bytes() const { return static_cast<std::int64_t>(buffer_mb * 1024.0 * 1024.0); }
};

/// How a [tensor_parallel.plan] rule rewrites the Linear or Embedding modules it matches.
enum class TpStyle {
  kColumn,          ///< Linear: output features split; input replicated (or gathered along the sequence)
  kRow,             ///< Linear: input features split; output summed (or reduce-scattered along the sequence)
  kVocabEmbedding,  ///< Embedding: vocabulary rows split (padded to a multiple of tp); output summed
  kVocabOutput,     ///< Linear (the LM head): vocabulary split; logits stay split for vocab-parallel loss
  kReplicate,       ///< kept whole on every rank of the group
};

/// One entry of [tensor_parallel.plan]: `"blocks.*.qkv" = "column"`, or with options
/// `"blocks.*.qkv" = { style = "column", parts = 3, heads = 4 }`.
struct TpPlanRule {
  /// Module path glob, matched against whole dotted paths ("blocks.0.qkv"); `*` matches
  /// any run of characters other than '.', so "blocks.*.qkv" matches every block's qkv.
  std::string pattern;
  TpStyle style = TpStyle::kReplicate;
  /// column: the output is `parts` equal blocks (a fused [q | k | v] is 3), each split
  /// over tp so rank r holds the r-th slice of every block. Default: 1.
  std::int64_t parts = 1;
  /// column/row: attention heads laid along the split features (per part), checked to
  /// divide by tp so no head is cut; 0 = not an attention projection. Default: 0.
  std::int64_t heads = 0;
  /// column, vocab_output: all-gather the output so every rank holds all of it (for a
  /// loss that is not vocab-parallel). Default: false.
  bool gather_output = false;
  /// " at file:line:col" of the rule, for messages.
  std::string position;
};

/// [tensor_parallel]: how a model is split over the tensor-parallel group (parallel.tp).
struct TensorParallelOptions {
  /// Shard the activations between tensor-parallel regions (LayerNorm, residual,
  /// dropout) along the sequence: all-gather / reduce-scatter replace the all-reduces.
  /// Default: false.
  bool sequence_parallel = false;
  /// With sequence_parallel: the sequence dimension of activations, counted from the
  /// end (-2: [..., seq, hidden], as [batch, seq, hidden] and [seq, hidden]). Default: -2.
  std::int64_t sequence_dim = -2;
  /// Module path glob → style, applied at engine creation to an ordinary model; every
  /// Linear and Embedding must be matched by exactly one rule. Empty: the model is
  /// written with tensor_parallel/ layers. Default: empty.
  std::vector<TpPlanRule> plan;
};

/// How attention crosses the context-parallel group ([context_parallel] method).
enum class ContextMethod { kRing, kAllToAll };

/// [context_parallel]: how each sequence is split over the parallel.cp ranks.
struct ContextParallelOptions {
  /// ring: key/value blocks circulate around the group (any head count); all_to_all:
  /// activations exchanged from a sequence split to a head split around attention (heads
  /// must divide by cp). Default: ring.
  ContextMethod method = ContextMethod::kRing;
  /// Each rank holds chunks r and 2·cp − 1 − r of the 2·cp chunks, so causal attention
  /// costs every rank the same; false: one contiguous range each. Default: true.
  bool load_balance = true;
  /// The sequence dimension of the batch's tensors (inputs and targets), e.g. 1 for
  /// [batch, seq]; Engine::local_batch splits it. Default: 1.
  std::int64_t sequence_dim = 1;
};

enum class PipelineSchedule { kGPipe, k1F1B, kInterleaved, kZbH1 };
enum class PipelinePartition { kUniform, kParameters, kProfile, kExplicit };
enum class Recompute { kNone, kFull };

/// [pipeline]: how a model given as layer specs runs over the pipeline stages
/// (parallel.pp); see pipeline/schedule.h. train.grad_accum is the number of
/// micro-batches of one train_batch.
struct PipelineOptions {
  /// gpipe (all forwards, then all backwards) | 1f1b (at most pp - stage micro-batches
  /// in flight) | interleaved (1F1B over virtual_stages chunks per rank: a smaller
  /// bubble, more messages) | zb-h1 (1F1B with each backward split into its input and
  /// weight gradients, the weight halves deferred into the bubbles). Default: 1f1b.
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  /// Model chunks per rank; > 1 only with interleaved (which needs > 1). Default: 1.
  int virtual_stages = 1;
  /// How layers are split into pp × virtual_stages contiguous parts: uniform (layer
  /// counts), parameters (parameter counts), profile (measured forward + backward time
  /// per layer), or an explicit list of boundaries [0, b1, ..., layers]. Default:
  /// parameters.
  PipelinePartition partition = PipelinePartition::kParameters;
  /// partition given as a list: the first layer of each part, then the layer count.
  std::vector<std::int64_t> boundaries;
  /// none | full: keep only each stage's input during forward and run the forward again
  /// just before its backward (less activation memory, one more forward). Default: none.
  Recompute recompute = Recompute::kNone;
};

enum class CommBackend { kAuto, kMpi, kNccl };

/// How a launcher deals ranks onto nodes ([topology] emulate_rank_order; synthetic
/// clusters, topology.h's dealt_location).
enum class LauncherOrder { kBlock, kRoundRobin };

/// [topology]: the machine the mesh is placed on. By default each rank discovers its
/// own node with hwloc. An emulated cluster gives every rank a synthetic node instead,
/// so placements for several nodes can be tried, tested and shown on one machine
/// (nothing is bound to the emulated cores).
struct TopologyOptions {
  /// Emulated nodes; the world size must be a multiple. 0 = the real machine. Default: 0.
  std::int64_t emulate_nodes = 0;
  /// Each emulated node: an hwloc synthetic description, optionally with "gpu:N".
  /// Default: "pack:1 numa:2 core:8 pu:1 gpu:4".
  std::string emulate_node = "pack:1 numa:2 core:8 pu:1 gpu:4";
  /// block: ranks 0..k-1 on the first node (mpirun --map-by slot); round_robin: rank r
  /// on node r mod nodes (--map-by node). Default: block.
  LauncherOrder emulate_rank_order = LauncherOrder::kBlock;
};

/// [threads]: the CPU threads of each rank. By default Parallax decides from the cores
/// this rank owns (runtime/thread_budget.h) and prints the result.
struct ThreadOptions {
  /// LibTorch's intra-op threads per rank; 0 = decided from the rank's cores. Default: 0.
  int intra_op = 0;
  /// The BLAS library's threads per rank (where it has its own); 0 = decided. Default: 0.
  int blas = 0;
  /// Bind each rank to its share of the node's cores when the ranks do not outnumber
  /// the cores and the launcher did not bind it. Default: true.
  bool bind = true;
};

/// [comm]
struct CommOptions {
  /// auto | mpi | nccl; auto = NCCL for CUDA tensors when built, else MPI. Default: auto.
  CommBackend backend = CommBackend::kAuto;
  /// Seconds any single collective may take before it fails. Default: 300.
  double timeout_s = 300.0;
};

/// [logging]
struct LoggingOptions {
  /// Progress line every N optimizer steps on rank 0; 0 = never. Default: 10.
  std::int64_t every = 10;
  /// debug | info | warn | error. Default: info.
  LogLevel level = LogLevel::kInfo;
  /// JSON lines, one object per optimizer step, written by rank 0; "" = off. Default: "".
  std::string metrics_file;
  /// Directory for TensorBoard event files: rank 0 writes one file per run there
  /// (created if missing), each optimizer step's scalars (loss, lr, grad norm, step
  /// time, throughput, model-state bytes per rank, communication bytes per op; see
  /// tensorboard_scalars in core/metrics.h). "" = off. Default: "".
  std::string tensorboard_dir;
  /// Chrome trace JSON: one file, written by rank 0 at shutdown, holding every rank's
  /// spans (one process per rank; pipeline instructions carry micro_batch and chunk);
  /// a rank that cannot send its part writes it alone to a file with ".rank<N>" before
  /// the extension. "" = off. Default: "".
  std::string trace_file;
};

/// [memory]: each rank's memory.
struct MemoryOptions {
  /// The most bytes (MiB) LibTorch's CPU allocator may hold on each rank: an allocation
  /// past it stops the run with a MemoryLimitError naming the rank, the phase and the
  /// request, as a device past its memory would (a CPU run standing in for a device of
  /// known capacity). 0: none. Not on CUDA devices yet. Default: 0.
  double limit_mb = 0.0;
  std::int64_t limit_bytes() const { return static_cast<std::int64_t>(limit_mb * 1024.0 * 1024.0); }
};

/// [checkpoint]: where and when the engine saves its training state, and what it resumes
/// from (runtime/checkpointing.h).
enum class AutoPreference { kThroughput, kMemory };

/// [auto]: what the planner optimizes when it chooses layout keys (parallel.mode =
/// "auto", or keys set to "auto"; runtime/auto_layout.h).
struct AutoOptions {
  /// Memory a rank's plan may use, in GB (model state, activations, buffers); 0 = the
  /// rank's share of the host's memory. Default: 0.
  double max_memory_gb = 0.0;
  /// throughput (the fastest plan that fits) | memory (the smallest). Default: throughput.
  AutoPreference prefer = AutoPreference::kThroughput;
  /// Directory of the measured layer-time files (planner/layer_profile_file.h); "" =
  /// $XDG_CACHE_HOME/parallax or ~/.cache/parallax; "none" = keep none. Default: "".
  std::string profile_cache;
};

struct CheckpointOptions {
  /// Root directory: one step-<N> directory per checkpoint; "" = none. Default: "".
  std::string dir;
  /// Engine::step() saves after every N-th optimizer step; 0 = only when the trainer
  /// calls save_checkpoint(). Needs dir. Default: 0.
  std::int64_t every = 0;
  /// Complete checkpoints kept under dir (the oldest go after each save); 0 = all.
  /// Default: 3.
  std::int64_t keep = 3;
  /// What Engine::resume() loads: "" or "none" = nothing (start afresh); "latest" = the
  /// newest complete checkpoint under dir (torn ones are passed over, with a note); a
  /// path ending in .safetensors = weights only (pretrained weights, any layout: the
  /// optimizer and the step start afresh); else a checkpoint directory, which must be
  /// complete. Default: "".
  std::string load;
  /// Longest a rank waits for the others while a checkpoint is written or read, in
  /// seconds. Default: 1800.
  double timeout_s = 1800.0;
  /// Save in the background: the state is copied into host memory at the step
  /// boundary and written by a thread while training goes on; the next save (and the
  /// engine's end) waits for it. Default: false.
  bool async = false;
  /// On SIGTERM or SIGUSR1 to any rank (a scheduler's notice before it kills the job),
  /// every rank saves at the next step boundary and the engine's preempted() turns true,
  /// for the trainer to stop and exit 0. Takes effect when dir is set. Default: true.
  bool preemption = true;
  /// The engine's finish() writes the final checkpoint's weights, whole and under the
  /// model's parameter names, to this file: .safetensors, or .pt / .pth for torch.load.
  /// Needs dir. "" = none. Default: "".
  std::string export_on_finish;
};

/// A table owned by the application (e.g. [model], [data]). Typed, position-aware
/// access; reading a key that is missing, or of another type, throws ConfigError
/// naming the file, line and key. Integers are accepted by get_double. A dotted key
/// ("attention.heads") reads from a sub-table ([model.attention]).
class AppTable {
 public:
  class Impl;
  explicit AppTable(std::shared_ptr<const Impl> impl);

  const std::string& name() const;
  bool contains(const std::string& key) const;
  std::int64_t get_int(const std::string& key) const;
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  /// Throws ConfigError for any key not in `allowed`, with a "did you mean".
  void expect_only(const std::vector<std::string>& allowed) const;

  /// The loader's representation (opaque outside the config loader).
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

struct Config;

/// [engine.<name>]: the options of one engine of several (a trainer with two models),
/// over the run's: its own [zero], [offload] and [precision] keys and grad_accum. The
/// engines share everything else (the degrees and mesh, the batch per rank, [optimizer]).
struct EngineTable {
  /// The run's config with the table's keys over it, its positions those of the table's
  /// keys where it set them; not resolved (the runtime resolves it with the run's
  /// micro-batch: with its own grad_accum, an engine's global batch is its own).
  std::shared_ptr<const Config> config;
  /// The keys the table set, e.g. {"train.grad_accum", "zero.stage"}.
  std::vector<std::string> keys;
};

struct Config {
  TrainOptions train;
  OptimizerOptions optimizer;
  SchedulerOptions scheduler;
  PrecisionOptions precision;
  ParallelOptions parallel;
  ZeroOptions zero;
  OffloadOptions offload;
  TensorParallelOptions tensor_parallel;
  ContextParallelOptions context_parallel;
  PipelineOptions pipeline;
  TopologyOptions topology;
  ThreadOptions threads;
  CommOptions comm;
  LoggingOptions logging;
  MemoryOptions memory;
  CheckpointOptions checkpoint;
  AutoOptions automatic;  ///< [auto]

  /// Application tables by name, as declared to the loader.
  std::map<std::string, AppTable> app;
  /// [engine.<name>] tables by engine name (each declared to the loader).
  std::map<std::string, EngineTable> engines;
  /// The files that were read, in order (extends first), for messages.
  std::vector<std::string> sources;
  /// Where each key that was set came from, for messages: "zero.stage" →
  /// " at train.toml:12:9". Keys left at their defaults are absent. Not hashed.
  std::map<std::string, std::string> positions;

  /// Layout keys given as "auto" ("zero.stage", ...): the planner chooses them
  /// (runtime/auto_layout.h). They keep their defaults here and their positions above.
  /// Not hashed, not written by to_toml.
  std::set<std::string> auto_keys;
  /// The layout keys that may be "auto", in to_toml order.
  static const std::vector<std::string>& plannable_keys();

  /// positions[key] (" at train.toml:12:9"), or "" when the key was left at its default.
  std::string position_of(const std::string& key) const;

  /// The application table `name`; throws ConfigError if the config has none.
  const AppTable& app_table(const std::string& name) const;

  /// Fills dp (when -1) and the omitted batch value for `world_size` ranks, and checks
  /// tp × pp × dp == world_size and the batch identity exactly. Throws ConfigError
  /// naming the keys and values on any mismatch. Idempotent.
  void resolve(int world_size);
};

}  // namespace parallax
