// The Parallax sections: their keys, ranges and enum spellings, in one table
// (sections()). To add a section ([pipeline], [offload], ...): add its options struct
// to config.h, write its `fields` function here (and its `check` in config_checks.cpp
// if it has conditions that involve other keys or features this build lacks), and add
// one row to kSections. Reading, unknown-key errors, suggestions and to_toml follow from it.
#include <sstream>
#include <vector>

#include "parallax/core/config_loader.h"
#include "parallax/core/config_toml.h"
#include "parallax/core/error.h"
#include "parallax/core/fnv1a.h"

namespace parallax {
namespace detail {
namespace {

// ---- Enum spellings (also used by to_string) ----------------------------------------

constexpr EnumName<OptimizerType> kOptimizerNames[] = {{OptimizerType::kSgd, "sgd"},
                                                       {OptimizerType::kAdam, "adam"},
                                                       {OptimizerType::kAdamW, "adamw"},
                                                       {OptimizerType::kRmsprop, "rmsprop"},
                                                       {OptimizerType::kAdagrad, "adagrad"}};
constexpr EnumName<SchedulerType> kSchedulerNames[] = {
    {SchedulerType::kConstant, "constant"}, {SchedulerType::kLinear, "linear"}, {SchedulerType::kCosine, "cosine"}};
constexpr EnumName<Dtype> kDtypeNames[] = {{Dtype::kFp32, "fp32"}, {Dtype::kBf16, "bf16"}, {Dtype::kFp16, "fp16"}};
constexpr EnumName<ParallelMode> kModeNames[] = {{ParallelMode::kManual, "manual"}, {ParallelMode::kAuto, "auto"}};
constexpr EnumName<ContextMethod> kContextMethodNames[] = {{ContextMethod::kRing, "ring"},
                                                           {ContextMethod::kAllToAll, "all_to_all"}};
constexpr EnumName<AxisOrder> kAxisOrderNames[] = {{AxisOrder::kTpDpPp, "tp-dp-pp"}, {AxisOrder::kTpPpDp, "tp-pp-dp"}};
constexpr EnumName<OffloadTarget> kOffloadNames[] = {
    {OffloadTarget::kNone, "none"}, {OffloadTarget::kCpu, "cpu"}, {OffloadTarget::kNvme, "nvme"}};
constexpr EnumName<LauncherOrder> kLauncherOrderNames[] = {{LauncherOrder::kBlock, "block"},
                                                           {LauncherOrder::kRoundRobin, "round_robin"}};
constexpr EnumName<TrainDevice> kDeviceNames[] = {{TrainDevice::kCpu, "cpu"}, {TrainDevice::kCuda, "cuda"}};
constexpr EnumName<CommBackend> kBackendNames[] = {
    {CommBackend::kAuto, "auto"}, {CommBackend::kMpi, "mpi"}, {CommBackend::kNccl, "nccl"}};
constexpr EnumName<PipelineSchedule> kScheduleNames[] = {{PipelineSchedule::kGPipe, "gpipe"},
                                                         {PipelineSchedule::k1F1B, "1f1b"},
                                                         {PipelineSchedule::kInterleaved, "interleaved"},
                                                         {PipelineSchedule::kZbH1, "zb-h1"}};
// The last is the explicit list of boundaries (an array in TOML).
constexpr EnumName<PipelinePartition> kPartitionNames[] = {{PipelinePartition::kUniform, "uniform"},
                                                           {PipelinePartition::kParameters, "parameters"},
                                                           {PipelinePartition::kProfile, "profile"},
                                                           {PipelinePartition::kExplicit, "boundaries"}};
constexpr EnumName<Recompute> kRecomputeNames[] = {{Recompute::kNone, "none"}, {Recompute::kFull, "full"}};
// Same spellings as parse_log_level in logging.h.
constexpr EnumName<LogLevel> kLogLevelNames[] = {
    {LogLevel::kDebug, "debug"}, {LogLevel::kInfo, "info"}, {LogLevel::kWarn, "warn"}, {LogLevel::kError, "error"}};

template <typename E, std::size_t N>
const char* name_of(const EnumName<E> (&names)[N], E value) {
  for (const EnumName<E>& name : names) {
    if (name.value == value) return name.name;
  }
  return "?";
}

// ---- Ranges ------------------------------------------------------------------------

constexpr Rule kAnyInteger{[](double) { return true; }, "an integer"};
constexpr Rule kCount{[](double v) { return v >= 1; }, "an integer >= 1"};
constexpr Rule kCountOrZero{[](double v) { return v >= 0; }, "an integer >= 0"};
constexpr Rule kDataDegree{[](double v) { return v == -1 || v >= 1; }, "-1 (the ranks left over) or an integer >= 1"};
constexpr Rule kZeroStage{[](double v) { return v >= 0 && v <= 3; }, "0..3"};
constexpr Rule kPositive{[](double v) { return v > 0; }, "a number > 0"};
constexpr Rule kNonNegative{[](double v) { return v >= 0; }, "a number >= 0"};
constexpr Rule kUnitInterval{[](double v) { return v >= 0 && v < 1; }, "a number in [0, 1)"};
// A millisecond at least (shorter fails every collective), about 11 days at most.
constexpr Rule kTimeoutSeconds{[](double v) { return v >= 0.001 && v <= 1e6; }, "seconds in [0.001, 1e6]"};
// One bucket is one collective: MPI counts elements in an int (2^31 fp32 = 8 GiB).
// fp16's largest finite value is 65504; scales are kept within fp32's exact powers of 2.
constexpr Rule kLossScale{[](double v) { return v > 0 && v <= 1.7e38; }, "a number in (0, 1.7e38]"};
constexpr Rule kBackoff{[](double v) { return v > 0 && v < 1; }, "a number in (0, 1)"};
constexpr Rule kMegabytesOrZero{[](double v) { return v >= 0 && v <= 1048576; }, "MiB in [0, 1048576]"};
constexpr Rule kBufferCount{[](double v) { return v >= 2; }, "an integer >= 2"};
constexpr Rule kBucketMegabytes{[](double v) { return v >= 0.001 && v <= 8192; }, "MiB in [0.001, 8192]"};

// ---- Fields ------------------------------------------------------------------------

void train_fields(FieldVisitor& v, Config& c) {
  v.integer_or_inferred("global_batch_size", c.train.global_batch_size, kCount,
                        "Samples per optimizer step, over all data-parallel ranks.");
  v.integer_or_inferred("micro_batch_size", c.train.micro_batch_size, kCount,
                        "Samples each data-parallel rank feeds per micro-step (per pipeline micro-batch).");
  v.integer_or_inferred("grad_accum", c.train.grad_accum, kCount,
                        "Micro-steps per optimizer step: gradient accumulation, or a pipeline's micro-batches.");
  v.integer("steps", c.train.steps, kCount, "Optimizer steps to train.");
  v.integer("seed", c.train.seed, kAnyInteger,
            "Seed of LibTorch's default generator on every rank (set by init), so models built after init start "
            "identical; tensor-parallel dropout streams derive from it.");
  // "cuda" is accepted here; whether this build and this node have one is the runtime's.
  v.choice("device", c.train.device, kDeviceNames,
           "Where the engine trains: the CPU, or each rank's GPU (the one nearest its cores, else local rank order).");
}

void optimizer_fields(FieldVisitor& v, Config& c) {
  v.choice("type", c.optimizer.type, kOptimizerNames,
           "The optimizer the engine builds over its fp32 state (LibTorch's, of that name).");
  v.number("lr", c.optimizer.lr, kPositive, "Peak learning rate (the scheduler's).");
  v.number_pair("betas", c.optimizer.betas, kUnitInterval, "Adam's coefficients of the running averages.");
  v.number("eps", c.optimizer.eps, kPositive, "Added to the denominator (adam, adamw, rmsprop, adagrad).");
  v.number("weight_decay", c.optimizer.weight_decay, kNonNegative,
           "Weight decay: L2 added to the gradient (sgd, adam, rmsprop, adagrad) or decoupled (adamw).");
  v.number("momentum", c.optimizer.momentum, kNonNegative, "Momentum (sgd, rmsprop).");
  v.number("dampening", c.optimizer.dampening, kNonNegative, "SGD: dampening of the momentum.");
  v.boolean("nesterov", c.optimizer.nesterov, "SGD: Nesterov momentum (needs momentum > 0 and dampening = 0).");
  v.boolean("amsgrad", c.optimizer.amsgrad, "Adam, AdamW: keep the running maximum of the second moments.");
  v.number("alpha", c.optimizer.alpha, kUnitInterval, "RMSprop: smoothing constant of the squared-gradient average.");
  v.boolean("centered", c.optimizer.centered, "RMSprop: divide by the gradient's variance, not its second moment.");
  v.number("lr_decay", c.optimizer.lr_decay, kNonNegative,
           "Adagrad: step k (from 1) uses lr / (1 + (k - 1) x lr_decay).");
  v.number("initial_accumulator_value", c.optimizer.initial_accumulator_value, kNonNegative,
           "Adagrad: the starting value of the squared-gradient sums.");
  v.number("grad_clip", c.optimizer.grad_clip, kNonNegative,
           "Clip gradients to this global norm, over every rank's parts; 0: off.");
  v.text_list("no_decay", c.optimizer.no_decay,
              "Parameters exempt from weight decay, by kind: \"bias\" (named bias), \"norm\" (normalization "
              "layers' parameters and every other 1-D parameter), \"embedding\" (embedding tables); they step in a "
              "parameter group of weight_decay 0.");
}

void scheduler_fields(FieldVisitor& v, Config& c) {
  v.choice("type", c.scheduler.type, kSchedulerNames,
           "Learning rate over optimizer steps: constant, or decaying linearly or as a cosine to min_lr at "
           "train.steps.");
  v.integer("warmup_steps", c.scheduler.warmup_steps, kCountOrZero,
            "Steps of linear warmup first: step k (from 0) uses lr x (k + 1) / warmup_steps.");
  v.number("min_lr", c.scheduler.min_lr, kNonNegative, "Where linear and cosine decay end.");
}

void precision_fields(FieldVisitor& v, Config& c) {
  v.choice("dtype", c.precision.dtype, kDtypeNames,
           "Compute dtype of the parameters and activations; bf16 and fp16 keep fp32 masters for the optimizer.");
  v.number("loss_scale_initial", c.precision.loss_scale_initial, kLossScale, "fp16: the first loss scale.");
  v.integer("loss_scale_growth_interval", c.precision.loss_scale_growth_interval, kCount,
            "fp16: steps without an overflow after which the scale doubles.");
  v.number("loss_scale_backoff", c.precision.loss_scale_backoff, kBackoff,
           "fp16: factor the scale is multiplied by when overflows exhaust the hysteresis.");
  v.integer("loss_scale_hysteresis", c.precision.loss_scale_hysteresis, kCount,
            "fp16: consecutive overflowing steps tolerated (each skipped) before the scale backs off.");
  v.number("loss_scale_min", c.precision.loss_scale_min, kLossScale,
           "fp16: the smallest scale; an overflow below it is an error (training diverged).");
}

void parallel_fields(FieldVisitor& v, Config& c) {
  v.choice("mode", c.parallel.mode, kModeNames,
           "manual: the layout keys as given; auto: the planner chooses every layout key the config leaves out "
           "or sets to \"auto\" (docs/planner.md).");
  v.integer("tp", c.parallel.tp, kCount, "Tensor-parallel degree: ranks that split each layer (kept inside a node).");
  v.integer("pp", c.parallel.pp, kCount, "Pipeline-parallel degree: stages the model's layers are cut into.");
  v.integer("cp", c.parallel.cp, kCount,
            "Context-parallel degree: ranks each sequence is split over (the axis after tp, inside a node).");
  v.integer("dp", c.parallel.dp, kDataDegree, "Data-parallel degree; -1: the world size / (tp x pp x cp).");
  v.integer("ep", c.parallel.ep, kCount,
            "Expert-parallel degree: ranks sharing out each MoE layer's experts, folded inside dp x cp (must divide "
            "it; docs/expert-parallelism.md).");
  v.choice("order", c.parallel.order, kAxisOrderNames,
           "Mesh axes, innermost first: tp-dp-pp puts pipeline stages across nodes first, tp-pp-dp data-parallel "
           "replicas.");
}

void zero_fields(FieldVisitor& v, Config& c) {
  v.integer("stage", c.zero.stage, kZeroStage,
            "0: plain data parallelism; 1: optimizer state sharded over dp; 2: also gradients; 3: also parameters.");
  v.number("bucket_mb", c.zero.bucket_mb, kBucketMegabytes,
           "Gradient bucket size; buckets are reduced as they fill. Stages 1-2: one flat sharded buffer.");
  v.boolean("overlap_comm", c.zero.overlap_comm, "Launch bucket reductions during backward.");
  v.number("prefetch_mb", c.zero.prefetch_mb, kMegabytesOrZero,
           "Stage 3: parameters gathered ahead of use, in the execution order recorded the step before; 0: on use.");
  v.integer("persistence_threshold", c.zero.persistence_threshold, kCountOrZero,
            "Stage 3: parameters of at most this many elements stay gathered on every rank (gradients still "
            "reduce-scattered).");
  v.number("max_live_mb", c.zero.max_live_mb, kMegabytesOrZero,
           "Stage 3: gathered bytes kept during forward; beyond it the least recently used unit is released.");
  v.boolean("reshard_after_forward", c.zero.reshard_after_forward,
            "Stage 3: release every unit but the forward's last when forward ends (false: keep them until their "
            "backward).");
  v.boolean("reshard_after_backward", c.zero.reshard_after_backward,
            "Stage 3: release each unit when its backward is done (false: keep it until the optimizer step).");
  v.text_list("wrap", c.zero.wrap,
              "Stage 3: module type names (\"Block\" matches BlockImpl) whose instances are units, gathered and "
              "released together; other parameters form the root unit.");
  v.integer("wrap_min_params", c.zero.wrap_min_params, kCountOrZero,
            "Stage 3: a module holding at least this many parameters not yet in a unit becomes one; 0: off.");
}

void offload_fields(FieldVisitor& v, Config& c) {
  v.choice("optimizer", c.offload.optimizer, kOffloadNames,
           "Where this rank's optimizer shard lives: cpu (masters and moments in host memory, the fused CPU Adam), "
           "nvme (moments in a file under nvme_path).");
  v.choice("param", c.offload.param, kOffloadNames,
           "Stage 3: no parameter shard stays on the device; gathers read this rank's part from the host master "
           "(cpu) or its file (nvme).");
  v.boolean("pin_memory", c.offload.pin_memory, "Page-locked host buffers (CUDA tensors only).");
  v.text("nvme_path", c.offload.nvme_path, "Directory of the NVMe tier's files (one per rank, unlinked once opened).");
  v.number("buffer_mb", c.offload.buffer_mb, kBucketMegabytes,
           "One host buffer of the NVMe tier: one tile's moments (and master).");
  v.integer("buffer_count", c.offload.buffer_count, kBufferCount,
            "Host buffers of the NVMe tier: reading tile k+1 and writing k-1 overlap updating k.");
}

constexpr Rule kFromTheEnd{[](double v) { return v <= -1; }, "a dimension counted from the end (-1, -2, ...)"};

void tensor_parallel_fields(FieldVisitor& v, Config& c) {
  v.boolean("sequence_parallel", c.tensor_parallel.sequence_parallel,
            "Split the activations between tensor-parallel regions along the sequence (all-gather and "
            "reduce-scatter replace the all-reduces).");
  v.integer("sequence_dim", c.tensor_parallel.sequence_dim, kFromTheEnd,
            "With sequence_parallel: the activations' sequence dimension, counted from the end.");
  v.module_plan("plan", c.tensor_parallel.plan,  // last: printed as one inline table
                "Module path glob -> how its Linear or Embedding is split; every one must match exactly one rule. "
                "Empty: the model is written with tensor_parallel/ layers.");
}

void context_parallel_fields(FieldVisitor& v, Config& c) {
  v.choice("method", c.context_parallel.method, kContextMethodNames,
           "ring: key/value blocks circulate around the group (any head count); all_to_all: a sequence split "
           "exchanged for a head split around attention (heads must divide by cp).");
  v.boolean("load_balance", c.context_parallel.load_balance,
            "Rank r holds chunks r and 2cp-1-r of 2cp, so causal attention costs every rank the same.");
  v.integer("sequence_dim", c.context_parallel.sequence_dim, kCountOrZero,
            "The batch tensors' sequence dimension, which Engine::local_batch splits over cp.");
}

void pipeline_fields(FieldVisitor& v, Config& c) {
  v.choice("schedule", c.pipeline.schedule, kScheduleNames,
           "gpipe: all forwards, then all backwards; 1f1b: at most pp - stage micro-batches in flight; "
           "interleaved: 1F1B over virtual_stages chunks per rank; zb-h1: weight gradients deferred into the "
           "bubbles.");
  v.integer("virtual_stages", c.pipeline.virtual_stages, kCount,
            "Model chunks per rank: > 1 only with interleaved, which needs > 1.");
  v.choice_or_integers("partition", c.pipeline.partition, kPartitionNames, c.pipeline.boundaries,
                       "How layers are cut into pp x virtual_stages parts: equal layer counts, equal parameter "
                       "counts, measured time, or the first layer of each part then the layer count.");
  v.choice("recompute", c.pipeline.recompute, kRecomputeNames,
           "full: keep only each stage's input during forward and run the forward again before its backward.");
}

void comm_fields(FieldVisitor& v, Config& c) {
  // "nccl" is accepted here; whether this build and these tensors can use it is the
  // runtime's question.
  v.choice("backend", c.comm.backend, kBackendNames,
           "Collectives' library: auto is NCCL for CUDA tensors when built with it, MPI otherwise.");
  v.number("timeout_s", c.comm.timeout_s, kTimeoutSeconds,
           "The longest any single collective may take before it fails, naming the op and group.");
}

void topology_fields(FieldVisitor& v, Config& c) {
  v.integer("emulate_nodes", c.topology.emulate_nodes, kCountOrZero,
            "Emulated nodes (the world size must be a multiple) to place the mesh on; 0: the real machine (hwloc).");
  v.text("emulate_node", c.topology.emulate_node,
         "Each emulated node: an hwloc synthetic description, optionally with \"gpu:N\".");
  v.choice("emulate_rank_order", c.topology.emulate_rank_order, kLauncherOrderNames,
           "How the emulated launcher deals ranks onto nodes: block (--map-by slot) or round_robin (--map-by node).");
}

void thread_fields(FieldVisitor& v, Config& c) {
  v.integer("intra_op", c.threads.intra_op, kCountOrZero,
            "LibTorch's intra-op threads per rank; 0: decided from the cores this rank owns.");
  v.integer("blas", c.threads.blas, kCountOrZero, "The BLAS library's own threads per rank; 0: decided.");
  v.boolean("bind", c.threads.bind,
            "Bind each rank to its share of the node's cores, unless the launcher bound it or the ranks outnumber "
            "the cores.");
}

void logging_fields(FieldVisitor& v, Config& c) {
  v.integer("every", c.logging.every, kCountOrZero, "A progress line on rank 0 every this many steps; 0: never.");
  v.choice("level", c.logging.level, kLogLevelNames, "The least severe message printed.");
  v.text("metrics_file", c.logging.metrics_file,
         "JSON lines written by rank 0, one object per optimizer step; \"\": off.");
  v.text("tensorboard_dir", c.logging.tensorboard_dir,
         "Directory (created if missing) where rank 0 writes a TensorBoard event file per run: each optimizer "
         "step's loss, lr, grad norm, step time, throughput, model-state bytes per rank and communication bytes "
         "per op; \"\": off.");
  v.text("trace_file", c.logging.trace_file,
         "Chrome trace JSON of every rank's spans, written by rank 0 at shutdown; \"\": off.");
}

void memory_fields(FieldVisitor& v, Config& c) {
  v.number("limit_mb", c.memory.limit_mb, kNonNegative,
           "The most MiB LibTorch's CPU allocator may hold on each rank; past it the run stops with an error naming "
           "the rank, the phase and the request, as a device past its memory would; 0: none (not on CUDA yet).");
}

constexpr EnumName<AutoPreference> kPreferenceNames[] = {{AutoPreference::kThroughput, "throughput"},
                                                         {AutoPreference::kMemory, "memory"}};

void auto_fields(FieldVisitor& v, Config& c) {
  v.number("max_memory_gb", c.automatic.max_memory_gb, kNonNegative,
           "Memory a rank's plan may use, in GB (model state, activations, buffers); 0: the rank's share of the "
           "host's memory.");
  v.choice("prefer", c.automatic.prefer, kPreferenceNames,
           "throughput: the fastest plan that fits; memory: the plan that needs least memory.");
  v.text("profile_cache", c.automatic.profile_cache,
         "Directory where rank 0 keeps the layer times it measures, one file per model, dtype, machine, rank count "
         "and build, so the next run with the same ones skips the timing; \"\": $XDG_CACHE_HOME/parallax (or "
         "~/.cache/parallax); \"none\": measure every run, keep nothing.");
}

void checkpoint_fields(FieldVisitor& v, Config& c) {
  v.text("dir", c.checkpoint.dir, "Root directory of the checkpoints (one step-<N> directory each); \"\": none.");
  v.integer("every", c.checkpoint.every, kCountOrZero,
            "Save after every this many optimizer steps; 0: only when the trainer calls save_checkpoint().");
  v.integer("keep", c.checkpoint.keep, kCountOrZero,
            "Complete checkpoints kept under dir, the oldest removed after each save; 0: all.");
  v.text("load", c.checkpoint.load,
         "What resume() loads: \"none\" or \"\", \"latest\" (the newest complete one under dir), a checkpoint "
         "directory, or a .safetensors file (weights only, any layout).");
  v.number("timeout_s", c.checkpoint.timeout_s, kTimeoutSeconds,
           "The longest a rank waits for the others while a checkpoint is written or read.");
  v.boolean("async", c.checkpoint.async,
            "Copy the state to host memory at the step boundary and write it from a thread while training goes on.");
  v.boolean("preemption", c.checkpoint.preemption,
            "On SIGTERM or SIGUSR1 to any rank, every rank saves at the next step boundary and the engine reports "
            "preempted() (needs dir).");
  v.text("export_on_finish", c.checkpoint.export_on_finish,
         "At finish(), write the final weights whole under the model's names to this .safetensors, .pt or .pth "
         "file; \"\": none.");
}

}  // namespace

const std::vector<SectionDef>& sections() {
  // One row per section, in to_toml order. Immutable; built on first use.
  static const std::vector<SectionDef> kSections = {
      {"train",
       "The batch and the run's length. `global_batch_size = micro_batch_size x grad_accum x dp` exactly "
       "(dp from [parallel]): any two of the three determine the third. A batch value given later (a file "
       "that `extends` another, a later `--config`, `--set`) overrides the earlier ones it contradicts, "
       "grad_accum giving way first, then micro_batch_size; a contradiction within one file or within the "
       "command line is an error.",
       train_fields, nullptr, /*in_plan=*/true},
      {"optimizer",
       "The optimizer the engine steps. A key that only some types read (`momentum`, `dampening`, `nesterov`, "
       "`amsgrad`, `alpha`, `centered`, `lr_decay`, `initial_accumulator_value`) must keep its default under the "
       "others. A trainer that passes its own LibTorch optimizer to the engine supplies these values; the keys set "
       "here override it.",
       optimizer_fields, optimizer_check},
      {"scheduler", "The learning rate over optimizer steps. `min_lr` must not exceed `optimizer.lr`.",
       scheduler_fields, scheduler_check},
      {"precision",
       "Mixed precision. The `loss_scale_*` keys apply to fp16 only; `loss_scale_min` must not exceed "
       "`loss_scale_initial`.",
       precision_fields, precision_check, /*in_plan=*/true},
      {"parallel",
       "How the ranks are divided: `tp x pp x dp` must equal the world size. Every product the strategy matrix "
       "allows runs; the rest are refused naming the keys (`parallax-matrix` prints it). Any layout key (tp, pp, "
       "dp, zero.stage, offload.optimizer and .param, pipeline.schedule, .virtual_stages and .recompute, "
       "train.micro_batch_size and .grad_accum) may be \"auto\": the planner chooses it for this world.",
       parallel_fields, nullptr},
      {"zero",
       "How model state is sharded over the data-parallel group (ZeRO). The stage 3 keys apply at stage 3 only.",
       zero_fields, nullptr, /*in_plan=*/true},
      {"offload",
       "Where the sharded model state lives. `optimizer` needs `zero.stage` >= 1 and Adam or AdamW; `param` needs "
       "`zero.stage = 3` and the optimizer offloaded, and `param = \"nvme\"` needs `optimizer = \"nvme\"`; "
       "`nvme_path` is required by nvme and refused otherwise.",
       offload_fields, offload_check, /*in_plan=*/true},
      {"tensor_parallel",
       "How each (stage's) model is split over the tensor-parallel group (`parallel.tp` > 1). "
       "`sequence_parallel` needs a `plan`.",
       tensor_parallel_fields, tensor_parallel_check, /*in_plan=*/true},
      {"context_parallel",
       "How each sequence is split over `parallel.cp` ranks: the engine's local_batch splits the sequence "
       "dimension and the model's attention crosses the group (docs/context-parallelism.md).",
       context_parallel_fields, nullptr, /*in_plan=*/true},
      {"pipeline",
       "How a model given as layer specs runs over `parallel.pp` stages; `train.grad_accum` is the number of "
       "micro-batches per step. `virtual_stages` > 1 goes with `schedule = \"interleaved\"`.",
       pipeline_fields, pipeline_check, /*in_plan=*/true},
      {"topology", "The machine the mesh is placed on: the real one (hwloc), or emulated nodes.", topology_fields,
       nullptr},
      {"threads", "Each rank's CPU threads; by default decided from the cores it owns.", thread_fields, nullptr},
      {"comm", "Communication.", comm_fields, nullptr},
      {"logging", "What rank 0 prints and writes.", logging_fields, nullptr},
      {"memory", "Each rank's memory.", memory_fields, nullptr},
      {"checkpoint", "Saving and resuming. `every`, `load = \"latest\"` and `export_on_finish` need `dir`.",
       checkpoint_fields, checkpoint_check},
      {"auto",
       "What the planner optimizes when it chooses the layout keys (`parallel.mode = \"auto\"`, or keys set to "
       "\"auto\"); ignored otherwise. See docs/planner.md.",
       auto_fields, nullptr},
  };
  return kSections;
}

const SectionDef* find_section(const std::string& name) {
  for (const SectionDef& section : sections()) {
    if (name == section.name) return &section;
  }
  return nullptr;
}

}  // namespace detail

const char* to_string(LauncherOrder order) {
  return detail::name_of(detail::kLauncherOrderNames, order);
}
const char* to_string(OptimizerType type) {
  return detail::name_of(detail::kOptimizerNames, type);
}
const char* to_string(SchedulerType type) {
  return detail::name_of(detail::kSchedulerNames, type);
}
const char* to_string(Dtype dtype) {
  return detail::name_of(detail::kDtypeNames, dtype);
}
const char* to_string(ContextMethod method) {
  return detail::name_of(detail::kContextMethodNames, method);
}
const char* to_string(AxisOrder order) {
  return detail::name_of(detail::kAxisOrderNames, order);
}
const char* to_string(ParallelMode mode) {
  return detail::name_of(detail::kModeNames, mode);
}
const char* to_string(OffloadTarget target) {
  return detail::name_of(detail::kOffloadNames, target);
}
const char* to_string(TpStyle style) {
  return detail::name_of(detail::kTpStyleNames, style);
}
const char* to_string(PipelineSchedule schedule) {
  return detail::name_of(detail::kScheduleNames, schedule);
}
const char* to_string(PipelinePartition partition) {
  return detail::name_of(detail::kPartitionNames, partition);
}
const char* to_string(Recompute recompute) {
  return detail::name_of(detail::kRecomputeNames, recompute);
}
const char* to_string(CommBackend backend) {
  return detail::name_of(detail::kBackendNames, backend);
}
const char* to_string(TrainDevice device) {
  return detail::name_of(detail::kDeviceNames, device);
}

std::string to_toml(const Config& config) {
  std::ostringstream out;
  for (const detail::SectionDef& section : detail::sections()) {
    if (out.tellp() > 0) out << "\n";
    detail::write_section(section, config, out);
  }
  detail::write_engine_tables(config, out);
  // App tables are printed by TOML++ inside a one-key root so that their sub-tables
  // get full headers ([model.attention]); std::map keeps the order stable. A table
  // written inline (model = {...}) must still be printed under a header: after
  // [logging], a plain key would land inside [logging].
  for (const auto& [name, table] : config.app) {
    toml::table copy = table.impl().table;
    copy.is_inline(false);
    toml::table root;
    root.insert(name, std::move(copy));
    out << "\n" << toml::toml_formatter{root} << "\n";
  }
  return out.str();
}

std::uint64_t config_hash(const Config& config) {
  return fnv1a_64(to_toml(config));
}

}  // namespace parallax
