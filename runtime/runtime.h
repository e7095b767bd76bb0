// parallax::init: the composition root's entry point.
//
//   int main(int argc, char** argv) {
//     auto rt = parallax::init(argc, argv, {{"model", "data"}});   // app tables
//     auto engine = rt.engine(model, optimizer);   // the trainer's own torch::optim::Adam
//     ...                                           // (or an OptimizerSpec from [optimizer])
//     if (rt.is_main()) std::printf(...);            // the trainer's output, once
//   }
//
// init runs, in order, on every rank (it is collective):
//  0. Before MPI starts: --help, --version and --config-reference are answered (on the
//     launcher's first rank) and the process exits 0; a flag that is neither Parallax's
//     nor one of InitOptions::flags is a UsageError (runtime/program_flags.h).
//  1. World: MPI with MPI_THREAD_MULTIPLE (a world of one without mpirun).
//  2. Config: --config FILE... and --set k=v from argv, strictly validated. Ranks agree
//     on success (one failing rank fails all, each with a clear message), then compare
//     config hashes; a mismatch names the ranks that differ.
//  3. Resolve: dp and the omitted batch value from the world size; seed LibTorch's
//     default generator with train.seed; open logging.metrics_file and
//     logging.tensorboard_dir on rank 0.
//  4. Topology: each rank discovers its node with hwloc (or takes an emulated one,
//     [topology] emulate_nodes); the cluster is gathered.
//  5. Plan and mesh: the plan (runtime/plan.h) refuses what this build does not run
//     (the strategy matrix, strategy_matrix.h, naming the keys) and places (tp, pp, dp)
//     on the cluster, tensor-parallel groups inside nodes; one communicator per group.
//  6. Rank 0 prints the resolved config, the cluster, the mesh, the plan and the BLAS.
// Every failure throws a parallax::Error on every rank: where only some ranks fail
// (a file, a node), the ranks agree first, so none is left waiting in a collective.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "parallax/core/config.h"
#include "parallax/core/logging.h"
#include "parallax/core/trace.h"
#include "parallax/runtime/auto_layout.h"
#include "parallax/runtime/program_flags.h"

namespace parallax {

class CpuMemoryMeter;
struct ThreadBudget;

class World;
class Mesh;
class StepApplier;
class MetricsWriter;
class Communicator;
class Cluster;
struct OptimizerSpec;
template <typename ModuleImpl>
class ModuleEngine;
namespace tensor_parallel {
class RngTracker;
}
namespace proto {
class Plan;
}
}  // namespace parallax
namespace torch::optim {
class Optimizer;
}
namespace parallax {

struct InitOptions {
  /// Tables the application owns (e.g. {"model", "data"}); any other unknown table is
  /// an error. Default: none.
  std::vector<std::string> app_tables;
  /// Print the resolved config, cluster and mesh on rank 0. Default: true.
  bool print_summary = true;
  /// One line saying what the program does, for --help. Default: none.
  std::string description{};
  /// The application's own flags, for --help; init refuses any other flag
  /// (program_flags.h). Default: none.
  std::vector<AppFlag> flags{};
  /// The program parses its own command line (getopt, CLI11, gflags...): init takes
  /// Parallax's flags (--config, --set) out of argc/argv and leaves every other argument
  /// there, in order and unchecked, for the program's parser; argv then points into the
  /// Runtime (valid while it lives). --help, --version and --config-reference are still
  /// answered first; `flags`, if given, are listed by --help. Default: false (a flag
  /// neither Parallax's nor in `flags` is refused with a did-you-mean).
  bool program_parses_flags = false;
  /// Names of the engines the program builds with EngineOptions (a trainer with several
  /// models), e.g. {"generator", "discriminator"}: each may have an [engine.<name>]
  /// table of its own zero, offload, precision and grad_accum keys. Default: none.
  std::vector<std::string> engines{};
};

/// One engine of several: its name selects its [engine.<name>] table, whose keys
/// override the run's for it alone (a large generator at ZeRO-3 beside a small
/// discriminator at stage 0, or another accumulation per model).
///
///   auto d_engine = rt.engine(discriminator, d_optimizer, parallax::EngineOptions("discriminator"));
struct EngineOptions {
  EngineOptions() = default;
  explicit EngineOptions(std::string name) : name(std::move(name)) {}
  /// One of InitOptions::engines; names the engine in the startup summary too.
  /// Default: "" (the run's options).
  std::string name{};
};

class Runtime {
 public:
  /// Steps 1–6 with the config read from argv (--config, --set).
  Runtime(int& argc, char**& argv, const InitOptions& options);
  /// Steps 1 and 3–6 with a config the caller loaded (tests, embedding applications);
  /// MPI may already be initialized by the caller. Still checks that ranks agree.
  /// The InitOptions' app_tables are not consulted: the caller loaded the config.
  Runtime(Config config, const InitOptions& options);
  /// Not copyable or movable: engines keep references into it. `auto rt = init(...)`
  /// needs neither (C++17 guaranteed copy elision).
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  /// Writes the trace file (if configured), releases the communicators, then the World
  /// (see World::~World for the bounded shutdown).
  ~Runtime();

  /// The training engine for `model`: a torch::nn::Module the trainer holds by value
  /// (the engine refers to it, so it must outlive the engine), a std::shared_ptr to one,
  /// or a ModuleHolder (torch::nn::Linear, a TORCH_MODULE type); defined in engine.h.
  /// Collective: broadcasts rank 0's parameters. `spec`: the optimizer from [optimizer].
  /// Throws UsageError for a name not in InitOptions::engines, a parameter another
  /// engine trains, a second engine of one name, or a second unnamed one saving into
  /// the same checkpoint.dir.
  template <typename Model>
  auto engine(Model&& model, const OptimizerSpec& spec, const EngineOptions& options = {});
  /// As above, keeping the trainer's own LibTorch optimizer (SGD, Adam, AdamW, RMSprop,
  /// Adagrad): the engine builds the same optimizer over its shards, masters or offloaded
  /// state, with the config's [optimizer] keys overriding (each difference is reported
  /// on rank 0), and empties `optimizer`: its step() then changes nothing of the model,
  /// and its zero_grad() clears the engine's gradients (runtime/trainer_optimizer.h).
  /// `optimizer` must outlive the engine. `options.name` selects the engine's own
  /// [engine.<name>] table (EngineOptions).
  template <typename Model>
  auto engine(Model&& model, torch::optim::Optimizer& optimizer, const EngineOptions& options = {});

  /// Whether this is the world's rank 0, the one rank that should print the trainer's
  /// own output: `if (rt.is_main()) std::printf(...)`. (Parallax's own lines go through
  /// logger(), which marks every other rank's lines with its rank.)
  bool is_main() const;
  const Config& config() const;
  World& world();
  Mesh& mesh();
  /// Where the engines train (train.device): the CPU, or this rank's GPU (current
  /// device from start on).
  c10::Device device() const;
  const Cluster& cluster() const;
  const Logger& logger() const;
  Tracer& tracer();
  /// A communicator over all ranks reserved for per-step telemetry (loss, metrics), so
  /// its traffic never shows in the counters of the groups that train.
  Communicator& telemetry();
  /// The metrics writer on rank 0 when `logging.metrics_file` or `logging.tensorboard_dir`
  /// is set; null elsewhere.
  MetricsWriter* metrics_writer();
  /// LibTorch's CPU allocator, counted from the runtime's start (core/cpu_memory_meter.h):
  /// each step's peak allocated bytes (StepMetrics::peak_memory). Null on a CUDA device.
  CpuMemoryMeter* memory_meter();
  /// Command-line arguments that were not --config/--set (argv[0] first).
  const std::vector<std::string>& args() const;
  /// parallel.mode = "auto": the planner's choice, its predicted step time and memory
  /// (runtime/auto_layout.h); empty, with zero predictions, when the config gave the
  /// layout.
  const AutoLayout& auto_layout() const;
  /// The resolved plan (proto/plan.proto): what the engines apply. They build
  /// themselves from it alone; the config it was made from is for the application.
  const proto::Plan& plan() const;
  /// The plan of the engine called `name`: the run's with its [engine.<name>] table over
  /// it (the run's own when it has none, or for ""). Throws UsageError for a name not in
  /// InitOptions::engines.
  const proto::Plan& engine_plan(const std::string& name) const;
  /// The resolved plan, as Protobuf text.
  std::string plan_text() const;
  /// The plan for people: the strategy, then every rank's coordinates, node, cores,
  /// device and groups (what `train_gpt --explain` prints).
  std::string explain() const;
  /// Random streams for tensor-parallel dropout: LibTorch's default generator, seeded
  /// with train.seed on every rank, for replicated activations, and the stream
  /// tensor_parallel::kSplitStream, seeded train.seed + 2718 + the tensor-parallel rank,
  /// for split ones (fork it around their dropout). Reproducible from train.seed.
  tensor_parallel::RngTracker& rng_tracker();
  /// Shared library that provides BLAS to LibTorch in this process, e.g.
  /// "libopenblas.so.0 (pthread)", or "unknown".
  const std::string& blas() const;
  /// This rank's cores and how its thread pools were sized (runtime/thread_budget.h).
  const ThreadBudget& threads() const;
  /// Internal to runtime/: the engines built on this runtime (their step appliers,
  /// which register themselves), so that one engine's backward finds the ZeRO-3
  /// parameters of another model it runs through.
  std::vector<StepApplier*>& engines();

 private:
  struct State;
  void start(const InitOptions& options);
  std::unique_ptr<State> state_;
};

/// Brings the runtime up; see the protocol above. Throws parallax::Error. Also installs a
/// std::terminate handler: an exception that escapes the trainer's main is reported as
/// report_error reports it (the other ranks stop at once) and the process exits 1, so a
/// trainer needs no try/catch of its own.
Runtime init(int& argc, char**& argv, const InitOptions& options = {});

/// For the application's catch block: prints `error` to stderr (with the rank) and
/// returns the process exit code to use (1).
int report_error(const std::exception& error);

}  // namespace parallax
