#include "parallax/planner/strategy_matrix.h"

#include <algorithm>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

// "key = value at file:line:col" (the position only when the key was set).
std::string key(const Config& config, const std::string& name, const std::string& value) {
  return name + " = " + value + config.position_of(name);
}

std::string quoted(const char* text) {
  return std::string("\"") + text + "\"";
}

// Empty when the cell runs; otherwise its first reason (the loader's, or the matrix's
// with its nearest cell) without the keys' values and where they were set, which the
// table's row shows.
std::string verdict_of(const ConfigSources& sources, int world_size) {
  Config config;
  try {
    config = load_config(sources);
    config.resolve(world_size);
  } catch (const ConfigError& e) {
    std::string reason = e.detail();
    const auto colon = reason.find(": ");
    if (colon != std::string::npos) reason = reason.substr(colon + 2);
    // "(zero.stage = 0 at --set zero.stage=0)": the row says which stage.
    const auto open = reason.find(" (zero.stage = ");
    if (open != std::string::npos) reason.erase(open, reason.find(')', open) - open + 1);
    return reason;
  }
  const std::vector<Refusal> refusals = strategy_refusals(config);
  if (refusals.empty()) return "";
  return refusals.front().reason + "; instead: " + refusals.front().nearest;
}

std::string escape_bars(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

std::string Refusal::message() const {
  std::string text;
  for (std::size_t i = 0; i < keys.size(); ++i) text += (i ? ", " : "") + keys[i];
  return text + ": " + reason + "; instead: " + nearest;
}

std::vector<Refusal> strategy_refusals(const Config& c) {
  std::vector<Refusal> refusals;
  const std::string tp = std::to_string(c.parallel.tp);

  const bool cuda = c.train.device == TrainDevice::kCuda;
  if (c.comm.backend == CommBackend::kNccl && !cuda) {
    refusals.push_back({{key(c, "comm.backend", quoted("nccl")), key(c, "train.device", quoted("cpu"))},
                        "the engine trains on CPU tensors, which NCCL cannot carry",
                        "comm.backend = \"auto\" or \"mpi\", or train.device = \"cuda\""});
  }
  if (cuda && c.comm.backend == CommBackend::kMpi) {
    refusals.push_back({{key(c, "train.device", quoted("cuda")), key(c, "comm.backend", quoted("mpi"))},
                        "the MPI backend carries host memory only (CUDA-aware MPI is not assumed)",
                        "comm.backend = \"auto\" (NCCL for CUDA tensors, MPI for host ones)"});
  }
  if (cuda && c.parallel.pp > 1) {
    refusals.push_back({{key(c, "train.device", quoted("cuda")), key(c, "parallel.pp", std::to_string(c.parallel.pp))},
                        "pipeline stages on GPUs are not in this build yet (activations between stages over NCCL "
                        "send/recv)",
                        "train.device = \"cpu\", or parallel.pp = 1"});
  }
  if (c.parallel.cp > 1) {
    const std::string cp = std::to_string(c.parallel.cp);
    if (cuda) {
      refusals.push_back({{key(c, "parallel.cp", cp), key(c, "train.device", quoted("cuda"))},
                          "context-parallel attention has not run on a GPU yet",
                          "train.device = \"cpu\""});
    }
    if (c.parallel.mode == ParallelMode::kAuto || !c.auto_keys.empty()) {
      std::vector<std::string> keys{key(c, "parallel.cp", cp)};
      if (c.parallel.mode == ParallelMode::kAuto) keys.push_back(key(c, "parallel.mode", quoted("auto")));
      for (const std::string& name : c.auto_keys) keys.push_back(key(c, name, quoted("auto")));
      refusals.push_back({keys, "the planner does not choose or model context parallelism yet",
                          "parallel.mode = \"manual\" with the degrees given"});
    }
  }
  if (c.parallel.ep > 1) {
    const std::string ep = std::to_string(c.parallel.ep);
    if (c.parallel.tp > 1 && c.tensor_parallel.sequence_parallel) {
      refusals.push_back({{key(c, "parallel.ep", ep), key(c, "tensor_parallel.sequence_parallel", "true")},
                          "under sequence parallelism each tensor-parallel rank routes its own part of the sequence, "
                          "while the experts' tensor-parallel halves need the same rows on every rank",
                          "tensor_parallel.sequence_parallel = false (experts split over tp by the plan), or "
                          "parallel.ep = 1"});
    }
    // ep with each of pp, tp and cp is proven equal to one process (and the triples with
    // dp); experts inside pipeline stages beside tp or cp have no test yet, and the
    // matrix marks "runs" only what a test has run.
    if (c.parallel.pp > 1 && (c.parallel.tp > 1 || c.parallel.cp > 1)) {
      std::vector<std::string> keys{key(c, "parallel.ep", ep), key(c, "parallel.pp", std::to_string(c.parallel.pp))};
      if (c.parallel.tp > 1) keys.push_back(key(c, "parallel.tp", tp));
      if (c.parallel.cp > 1) keys.push_back(key(c, "parallel.cp", std::to_string(c.parallel.cp)));
      refusals.push_back({keys,
                          "experts inside pipeline stages beside tp or cp have no equivalence test yet (ep with "
                          "each of pp, tp and cp alone runs)",
                          "parallel.pp = 1, or parallel.tp = 1 and parallel.cp = 1"});
    }
    if (cuda) {
      refusals.push_back({{key(c, "parallel.ep", ep), key(c, "train.device", quoted("cuda"))},
                          "expert parallelism has not run on a GPU yet",
                          "train.device = \"cpu\""});
    }
    if (c.parallel.mode == ParallelMode::kAuto || !c.auto_keys.empty()) {
      refusals.push_back({{key(c, "parallel.ep", ep), key(c, "parallel.mode", quoted("auto"))},
                          "the planner does not choose or model expert parallelism yet",
                          "parallel.mode = \"manual\" with the degrees given"});
    }
  }
  if (c.parallel.tp > 1 && c.tensor_parallel.sequence_parallel && c.tensor_parallel.plan.empty()) {
    refusals.push_back({{key(c, "tensor_parallel.sequence_parallel", "true"), key(c, "parallel.tp", tp)},
                        "the hand-written tensor_parallel/ layers are not sequence-parallel; only a "
                        "[tensor_parallel.plan] splits the sequence",
                        "a [tensor_parallel.plan] (see configs/tp.toml), or sequence_parallel = false"});
  }
  return refusals;
}

void check_strategy(const Config& config) {
  const std::vector<Refusal> refusals = strategy_refusals(config);
  if (refusals.empty()) return;
  std::string text = refusals.size() == 1 ? "this strategy is refused: " : "this strategy is refused:";
  for (const Refusal& refusal : refusals) text += (refusals.size() == 1 ? "" : "\n  - ") + refusal.message();
  throw ConfigError(text);
}

std::string strategy_matrix_markdown() {
  const std::vector<std::vector<std::string>> offloads{
      {},
      {"offload.optimizer=\"cpu\""},
      {"offload.optimizer=\"cpu\"", "offload.param=\"cpu\""},
  };
  std::vector<std::string> reasons;  // numbered in order of first appearance
  std::ostringstream rows;
  for (int tp : {1, 2}) {
    for (int cp : {1, 2}) {
      for (int ep : {1, 2}) {
        for (int pp : {1, 2}) {
          for (int stage = 0; stage <= 3; ++stage) {
            rows << "| " << tp << " | " << cp << " | " << ep << " | " << pp << " | " << stage << " |";
            for (const std::vector<std::string>& offload : offloads) {
              ConfigSources sources;
              sources.overrides = {"parallel.tp=" + std::to_string(tp), "parallel.cp=" + std::to_string(cp),
                                   "parallel.pp=" + std::to_string(pp), "parallel.dp=2",
                                   "parallel.ep=" + std::to_string(ep), "zero.stage=" + std::to_string(stage),
                                   "train.micro_batch_size=1"};
              if (tp > 1) sources.overrides.push_back("tensor_parallel.plan={\"*\"=\"column\"}");
              sources.overrides.insert(sources.overrides.end(), offload.begin(), offload.end());
              const std::string verdict = verdict_of(sources, tp * cp * pp * 2);
              if (verdict.empty()) {
                rows << " runs |";
                continue;
              }
              auto found = std::find(reasons.begin(), reasons.end(), verdict);
              if (found == reasons.end()) found = reasons.insert(reasons.end(), verdict);
              rows << " refused (" << (found - reasons.begin() + 1) << ") |";
            }
            rows << "\n";
          }
        }
      }
    }
  }
  std::ostringstream out;
  out << "| tp | cp | ep | pp | zero.stage | no offload | offload.optimizer | offload.optimizer + param |\n"
      << "|---|---|---|---|---|---|---|---|\n"
      << rows.str() << "\n";
  for (std::size_t i = 0; i < reasons.size(); ++i) out << i + 1 << ". " << escape_bars(reasons[i]) << "\n";
  return out.str();
}

}  // namespace parallax
