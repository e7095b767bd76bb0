#include "parallax/runtime/runtime.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/cpu_memory_meter.h"
#include "parallax/core/cpu_binding.h"
#include "parallax/core/device_routed_communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/failure_watch.h"
#include "parallax/core/flight_recorder.h"
#include "parallax/core/mesh.h"
#include "parallax/core/metrics.h"
#include "parallax/core/topology.h"
#include "parallax/core/world.h"
#if PARALLAX_WITH_NCCL
#include "parallax/core/nccl_communicator.h"
#endif
#include "parallax/runtime/auto_layout.h"
#include "parallax/runtime/blas_info.h"
#include "parallax/runtime/plan.h"
#include "parallax/runtime/thread_budget.h"
#include "parallax/tensor_parallel/rng_tracker.h"

#include <google/protobuf/text_format.h>

namespace parallax {

struct Runtime::State {
  /// Opened first and closed last: every block the run allocates on the host is counted.
  std::unique_ptr<CpuMemoryMeter> memory_meter;
  std::unique_ptr<World> world;
  Config config;
  AutoLayout auto_layout;  // parallel.mode = "auto"'s choice and predictions
  std::vector<std::string> args;
  Logger logger;
  std::unique_ptr<Tracer> tracer;
  c10::Device device{c10::kCPU};
  /// train.device = "cuda": the world over MPI and NCCL the mesh is split from (it
  /// outlives the mesh: NCCL before 2.18 splits by bootstrapping through it).
  std::unique_ptr<Communicator> device_world;
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<Communicator> telemetry;
  std::unique_ptr<MetricsWriter> metrics;
  std::string blas;
  ThreadBudget threads;
  proto::Plan plan;
  tensor_parallel::RngTracker rng;
  std::vector<StepApplier*> engines;  ///< live engines, in construction order
  std::vector<char*> argv;                              ///< program_parses_flags: into args
  std::vector<std::string> engine_names;                ///< InitOptions::engines
  std::map<std::string, proto::Plan> engine_plans;      ///< of the [engine.<name>] tables

  ~State() {
    if (tracer && tracer->enabled() && world) {
      try {
        write_merged_trace();
      } catch (const std::exception& e) {
        // A peer that is gone (or a file that cannot be written) must not lose this
        // rank's spans: they go to a file of its own.
        logger.error("merging the trace failed (", e.what(), "); writing this rank's part alone");
        try {
          tracer->write(Tracer::per_rank_path(config.logging.trace_file, world->rank()), world->rank());
        } catch (const std::exception& e2) {
          logger.error(e2.what());
        }
      }
    }
    // Communicators before the World that finalizes MPI.
    telemetry.reset();
    mesh.reset();
  }

  // Every rank's spans in one Chrome trace at logging.trace_file: each rank sends its
  // part (length, then bytes) to rank 0 over the telemetry communicator, which writes
  // them in rank order, one process per rank. Clocks share the origin set after init's
  // barrier. Each message waits at most a minute.
  void write_merged_trace() {
    PARALLAX_CHECK(telemetry != nullptr, InternalError, "no telemetry communicator");
    CollectiveOptions options;
    options.timeout = std::chrono::seconds(60);
    const int rank = world->rank();
    const std::string mine = tracer->events_json(rank);
    if (rank != 0) {
      at::Tensor length = at::full({1}, static_cast<std::int64_t>(mine.size()), at::kLong);
      telemetry->send(length, 0, 7, options)->wait();
      at::Tensor bytes = at::empty({static_cast<std::int64_t>(mine.size())}, at::kByte);
      std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
      telemetry->send(bytes, 0, 8, options)->wait();
      return;
    }
    std::vector<std::string> parts{mine};
    for (int peer = 1; peer < telemetry->size(); ++peer) {
      at::Tensor length = at::empty({1}, at::kLong);
      telemetry->recv(length, peer, 7, options)->wait();
      at::Tensor bytes = at::empty({length.item<std::int64_t>()}, at::kByte);
      telemetry->recv(bytes, peer, 8, options)->wait();
      parts.emplace_back(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()));
    }
    Tracer::write_merged(config.logging.trace_file, parts);
  }
};

namespace {

void check_same_config(World& world, const Config& config);

// train.device = "cuda": the GPU hwloc placed nearest this rank's cores ("gpuN", when
// the node shows GPUs and N is a visible CUDA device), else local rank order; made the
// current device. ConfigError where none is visible.
c10::Device choose_cuda_device(const std::string& placed, int local_rank, int local_size, const std::string& where) {
  const auto visible = static_cast<int>(torch::cuda::device_count());
  PARALLAX_CHECK(visible > 0, ConfigError, "train.device = \"cuda\"", where,
                 ": no CUDA device is visible to this process",
                 torch::cuda::is_available() ? "" : " (this LibTorch has no CUDA, or no GPU/driver is present)",
                 "; use train.device = \"cpu\" here");
  PARALLAX_CHECK(local_size <= visible, ConfigError, "train.device = \"cuda\"", where, ": ", local_size,
                 " ranks on this node but ", visible,
                 " visible CUDA device(s); NCCL needs one GPU per rank (start one rank per GPU)");
  int index = local_rank;
  if (placed.rfind("gpu", 0) == 0) {
    const int nearest = std::atoi(placed.c_str() + 3);
    if (nearest >= 0 && nearest < visible) index = nearest;
  }
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
  return device;
}

// The world whose groups carry CUDA tensors over NCCL and host tensors over MPI.
std::unique_ptr<Communicator> cuda_world(Communicator& mpi_world, const c10::Device& device) {
#if PARALLAX_WITH_NCCL
  std::unique_ptr<Communicator> nccl;
  run_everywhere(mpi_world, "creating the NCCL communicator",
                 [&] { nccl = create_nccl_communicator(mpi_world, device.index(), "world"); });
  auto host = mpi_world.split(0, mpi_world.rank(), "world");
  auto routed = route_by_device(std::move(host), std::move(nccl));
  routed->set_default_timeout(mpi_world.default_timeout());
  return routed;
#else
  (void)device;
  run_everywhere(mpi_world, "creating the NCCL communicator", [] {
    throw ConfigError(
        "train.device = \"cuda\": this build has no NCCL communicator (LibTorch without CUDA, or "
        "PARALLAX_WITH_NCCL=OFF); build against a CUDA LibTorch (TORCH=wheel scripts/test.sh)");
  });
  return nullptr;
#endif
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// An [engine.<name>] table's plan: the engine's config resolved with the run's degrees
// and micro-batch (its own grad_accum, when the table sets one, makes its own global
// batch), refused by the strategy matrix as the run's would be.
proto::Plan engine_plan_of(const Config& run, const std::string& name, const Cluster& cluster, bool emulated) {
  const EngineTable& table = run.engines.at(name);
  Config config = *table.config;
  config.parallel = run.parallel;
  config.train.micro_batch_size = run.train.micro_batch_size;
  if (std::find(table.keys.begin(), table.keys.end(), "train.grad_accum") == table.keys.end()) {
    config.train.grad_accum = run.train.grad_accum;
    config.train.global_batch_size = run.train.global_batch_size;
  }
  try {
    config.resolve(run.parallel.tp * run.parallel.pp * run.parallel.dp);
    return make_plan(config, cluster, emulated);
  } catch (const ConfigError& e) {
    throw ConfigError("[engine." + name + "]: " + e.detail());
  }
}

// Step 2 of init: load on every rank, agree, then compare what was loaded.
Config load_config_everywhere(World& world, const ConfigSources& sources, const InitOptions& options) {
  Config config;
  try {
    run_everywhere(world.communicator(), "loading the configuration",
                   [&] { config = load_config(sources, LoadOptions{options.app_tables, options.engines}); });
  } catch (const UsageError& e) {
    throw ConfigError(e.detail());
  }
  check_same_config(world, config);
  return config;
}

// "rank(s) {4,5} on node1 differ from rank 0 on node0": collective over the world (every
// rank calls it when `differing`, which every rank computed alike, is not empty).
std::string differing_ranks_and_hosts(World& world, const std::vector<int>& differing) {
  const std::vector<std::string> hosts = all_gather_strings(world.communicator(), world.hostname());
  std::vector<std::string> where;
  for (int rank : differing) {
    const std::string& host = hosts[static_cast<std::size_t>(rank)];
    if (std::find(where.begin(), where.end(), host) == where.end()) where.push_back(host);
  }
  std::string names;
  for (const std::string& host : where) names += (names.empty() ? "" : ", ") + host;
  return "rank(s) " + format_rank_set(differing) + " on " + names + " differ from rank 0 on " + hosts.front();
}

// All ranks must run the same build: another binary on one node (a stale copy, another
// version) would otherwise fail later and obscurely, or train wrongly.
void check_same_program(World& world) {
  const std::string identity = program_identity();
  const std::vector<int> differing =
      ranks_differing_from_root(world.communicator(), std::hash<std::string>{}(identity));
  if (differing.empty()) return;
  throw ConfigError(detail::concat("ranks run different programs: ", differing_ranks_and_hosts(world, differing),
                                   "; this rank runs ", executable_path(), " (", identity,
                                   "). Install the same build on every node (or build into a directory all "
                                   "nodes share)"));
}

// All ranks must train with the same configuration.
void check_same_config(World& world, const Config& config) {
  const std::vector<int> differing = ranks_differing_from_root(world.communicator(), config_hash(config));
  if (differing.empty()) return;
  throw ConfigError(detail::concat("ranks hold different configurations: ", differing_ranks_and_hosts(world, differing),
                                   " (check that every node reads the same files and --set values)"));
}

}  // namespace

Runtime::Runtime(int& argc, char**& argv, const InitOptions& options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  // What needs no MPI, before it starts: a --help answered, or a mistyped flag refused.
  ProgramHelp help{options.description, options.flags, options.app_tables};
  help.program_parses_flags = options.program_parses_flags;
  help.engines = options.engines;
  answer_informational_flags(argc, argv, help);
  const CommandLine command_line = parse_command_line(argc, argv);
  if (!options.program_parses_flags) check_flags(command_line, help);
  s.world = std::make_unique<World>(argc, argv);
  failure_watch::start();  // a timeout or a rank's error fails the job, naming the culprit
  s.args = command_line.rest;
  if (options.program_parses_flags) {
    // What the program's own parser sees: its arguments, without Parallax's.
    for (std::string& arg : s.args) s.argv.push_back(arg.data());
    s.argv.push_back(nullptr);
    argc = static_cast<int>(s.args.size());
    argv = s.argv.data();
  }
  check_same_program(*s.world);
  s.config = load_config_everywhere(*s.world, command_line.sources, options);
  start(options);
}

Runtime::Runtime(Config config, const InitOptions& options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  int argc = 0;
  char** argv = nullptr;
  s.world = std::make_unique<World>(argc, argv);
  failure_watch::start();
  check_same_program(*s.world);
  s.config = std::move(config);
  check_same_config(*s.world, s.config);
  start(options);
}

void Runtime::start(const InitOptions& options) {
  State& s = *state_;
  {
    CpuMemoryMeter::Options meter;
    meter.limit_bytes(s.config.memory.limit_bytes());
    if (s.config.memory.limit_mb > 0) {
      PARALLAX_CHECK(s.config.train.device != TrainDevice::kCuda, ConfigError, "memory.limit_mb = ",
                     s.config.memory.limit_mb, s.config.position_of("memory.limit_mb"),
                     ": a limit on a CUDA device's memory is not in this build yet; leave it 0 there");
      meter.source(detail::concat("memory.limit_mb = ", s.config.memory.limit_mb, ", rank ", s.world->rank(), " of ",
                                  s.world->size()));
    }
    s.memory_meter = std::make_unique<CpuMemoryMeter>(meter);
  }
  // parallel.mode = "auto": the planner sets the layout keys the config leaves open.
  s.auto_layout = choose_auto_layout(s.config, *s.world);
  s.config.resolve(s.world->size());
  // The library's own randomness (and the application's default generator) starts from
  // train.seed on every rank.
  at::manual_seed(static_cast<std::uint64_t>(s.config.train.seed));

  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(s.config.comm.timeout_s * 1000.0));
  s.world->communicator().set_default_timeout(timeout);
  // A rank that fails alone waits at shutdown until its peers' collectives time out
  // (timeout) and their communicators wind down, so every rank reports its own error.
  s.world->set_shutdown_timeout(timeout + std::chrono::seconds(30));
  s.logger = Logger(s.config.logging.level);
  s.tracer = std::make_unique<Tracer>(!s.config.logging.trace_file.empty());
  run_everywhere(s.world->communicator(), "opening logging.metrics_file and logging.tensorboard_dir", [&] {
    const LoggingOptions& logging = s.config.logging;
    if ((!logging.metrics_file.empty() || !logging.tensorboard_dir.empty()) && s.world->rank() == 0) {
      s.metrics = std::make_unique<MetricsWriter>(logging.metrics_file, logging.tensorboard_dir);
    }
  });

  // Each rank's node: discovered, or one of [topology]'s emulated nodes.
  const bool emulated = s.config.topology.emulate_nodes > 0;
  NodeTopology local_node;
  run_everywhere(s.world->communicator(), "topology discovery", [&] {
    local_node =
        emulated ? emulated_node(s.config.topology, s.world->rank(), s.world->size()) : NodeTopology::discover();
  });
  Cluster cluster = Cluster::gather(s.world->communicator(), local_node);
  cluster.check_uniform(/*gpus=*/s.config.train.device == TrainDevice::kCuda);
  // The plan (and so the placement) is decided before any communicator is split. Every
  // rank holds the same config and cluster, so every rank refuses a strategy the same
  // way, before anything is printed or built.
  s.plan = make_plan(s.config, cluster, emulated);
  s.engine_names = options.engines;
  for (const auto& [name, table] : s.config.engines) s.engine_plans[name] = engine_plan_of(s.config, name, cluster, emulated);
  Communicator* mesh_world = &s.world->communicator();
  if (s.config.train.device == TrainDevice::kCuda) {
    run_everywhere(s.world->communicator(), "choosing this rank's GPU", [&] {
      s.device = choose_cuda_device(s.plan.ranks(s.world->rank()).device(), s.world->local_rank(),
                                    s.world->local_size(), s.config.position_of("train.device"));
    });
    s.device_world = cuda_world(s.world->communicator(), s.device);
    mesh_world = s.device_world.get();
    s.memory_meter.reset();  // the host allocator's peak is not the device's
  }
  const ParallelOptions& p = s.config.parallel;
  s.mesh = std::make_unique<Mesh>(*mesh_world, std::move(cluster), MeshDegrees{p.tp, p.pp, p.dp, p.cp, p.ep}, p.order);
  // Dropout on split activations draws per tensor-parallel rank (Megatron's seed offset).
  s.rng.add(tensor_parallel::kSplitStream,
            static_cast<std::uint64_t>(s.config.train.seed) + 2718 + static_cast<std::uint64_t>(s.mesh->coord().tp));
  s.telemetry = s.world->communicator().split(0, s.world->rank(), "telemetry");
  if (s.tracer->enabled()) {
    // One time origin for every rank's spans (to within a barrier's skew), so the merged
    // trace lines them up.
    s.telemetry->barrier()->wait();
    s.tracer->align_origin();
  }

  // One owner of this rank's threads: its share of the node's cores, the pools sized
  // so that together they fit it (thread_budget.h).
  // When the launcher gave each rank of the node cores of its own (srun --cpus-per-task
  // with --cpu-bind, mpirun's PE=n), a rank's share is its whole binding.
  const std::vector<std::string> bindings = all_gather_strings(s.world->communicator(), process_binding());
  std::vector<std::string> node_bindings;
  for (int rank : s.mesh->cluster().ranks_on(s.mesh->cluster().node_of(s.world->rank()))) {
    node_bindings.push_back(bindings[static_cast<std::size_t>(rank)]);
  }
  const bool own_cores = bound_apart(node_bindings);
  const int sharing_ranks = own_cores ? 1 : s.world->local_size();
  const BlasThreading blas_threading = loaded_blas_threading();
  s.threads = budget_threads(rank_cpus(own_cores ? 0 : s.world->local_rank(), sharing_ranks), sharing_ranks,
                             blas_threading, s.config.offload.optimizer != OffloadTarget::kNone, s.config.threads);
  apply_thread_budget(s.threads);
  s.blas = describe_loaded_blas();

  const std::string core_advice = openblas_core_advice(openblas_core(), best_openblas_core_for_this_cpu());
  if (!core_advice.empty() && s.world->local_rank() == 0) s.logger.warn(core_advice);  // once per node
  if (is_reference_blas(s.blas)) {
    s.logger.warn("LibTorch is using the reference BLAS (", s.blas,
                  "), about 10x slower than OpenBLAS; install libopenblas0-pthread");
  }
  if (options.print_summary) {
    if (!s.auto_layout.explanation.empty()) s.logger.summary(s.auto_layout.explanation);
    s.logger.summary("# resolved configuration\n", to_toml(s.config));
    s.logger.summary("# cluster\n", s.mesh->cluster().describe());
    s.logger.summary("# mesh\n", s.mesh->describe());
    s.logger.summary("# ", describe_plan(s.plan));
    s.logger.summary("# blas: ", s.blas);
    s.logger.summary("# threads (rank 0): ", describe_thread_budget(s.threads, blas_threading));
  }
}

Runtime::~Runtime() = default;

const Config& Runtime::config() const {
  return state_->config;
}
c10::Device Runtime::device() const {
  return state_->device;
}
World& Runtime::world() {
  return *state_->world;
}
bool Runtime::is_main() const {
  return state_->world->rank() == 0;
}
Mesh& Runtime::mesh() {
  return *state_->mesh;
}
const Cluster& Runtime::cluster() const {
  return state_->mesh->cluster();
}
const AutoLayout& Runtime::auto_layout() const {
  return state_->auto_layout;
}
const Logger& Runtime::logger() const {
  return state_->logger;
}
Tracer& Runtime::tracer() {
  return *state_->tracer;
}
Communicator& Runtime::telemetry() {
  return *state_->telemetry;
}
CpuMemoryMeter* Runtime::memory_meter() {
  return state_->memory_meter.get();
}

MetricsWriter* Runtime::metrics_writer() {
  return state_->metrics.get();
}
const std::vector<std::string>& Runtime::args() const {
  return state_->args;
}
tensor_parallel::RngTracker& Runtime::rng_tracker() {
  return state_->rng;
}

const ThreadBudget& Runtime::threads() const {
  return state_->threads;
}
const std::string& Runtime::blas() const {
  return state_->blas;
}

const proto::Plan& Runtime::plan() const {
  return state_->plan;
}

const proto::Plan& Runtime::engine_plan(const std::string& name) const {
  const State& s = *state_;
  if (name.empty()) return s.plan;
  PARALLAX_CHECK(std::find(s.engine_names.begin(), s.engine_names.end(), name) != s.engine_names.end(), UsageError,
                 "EngineOptions(\"", name, "\"): this program's engines are {", join_names(s.engine_names),
                 "}; add the name to InitOptions::engines, so that the config may give it an [engine.", name,
                 "] table");
  const auto found = s.engine_plans.find(name);
  return found == s.engine_plans.end() ? s.plan : found->second;
}

std::vector<StepApplier*>& Runtime::engines() {
  return state_->engines;
}

std::string Runtime::plan_text() const {
  std::string text;
  google::protobuf::TextFormat::PrintToString(state_->plan, &text);
  return text;
}

std::string Runtime::explain() const {
  return describe_plan(state_->plan);
}

namespace {
// An exception that escapes the trainer's main (which needs no try/catch): reported as
// report_error reports it, so the other ranks stop at once, and the process exits 1
// instead of aborting with a core.
[[noreturn]] void report_uncaught_exception() {
  if (const std::exception_ptr error = std::current_exception()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      report_error(e);
    } catch (...) {
      std::fprintf(stderr, "%san exception that is not a std::exception ended the program\n", rank_prefix().c_str());
    }
    std::fflush(nullptr);
    std::_Exit(1);
  }
  std::fprintf(stderr, "%sstd::terminate called without an exception\n", rank_prefix().c_str());
  std::abort();
}
}  // namespace

Runtime init(int& argc, char**& argv, const InitOptions& options) {
  std::set_terminate(report_uncaught_exception);
  return Runtime(argc, argv, options);
}

int report_error(const std::exception& error) {
  const std::string what = error.what();
  // parallax::Error already carries the rank; anything else gets it here.
  const bool has_prefix = what.rfind("[rank ", 0) == 0;
  const bool heard = failure_watch::job_failed();  // a timeout here, or another rank's failure
  std::fprintf(stderr, "%s%s\n", has_prefix ? "" : rank_prefix().c_str(), what.c_str());
  if (dynamic_cast<const CommError*>(&error) != nullptr) {
    std::fprintf(stderr, "%sflight recorder (last 8 operations):\n%s", rank_prefix().c_str(),
                 FlightRecorder::instance().dump(8).c_str());
  }
  std::fflush(stderr);
  // This rank's own failure: the others stop waiting for it (failure_watch.h).
  if (!heard) failure_watch::announce_failure(has_prefix ? what.substr(what.find("] ") + 2) : what);
  return 1;
}

}  // namespace parallax
