#include "parallax/runtime/explain.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <sstream>
#include <vector>

#include "parallax/core/mesh.h"
#include "parallax/runtime/plan.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"

namespace parallax {
namespace {

// The groups a rank's traffic is counted in: tp, pp, the replicas (dp, or dp × cp with
// context parallelism: gradients and ZeRO's shards), cp, and the world.
constexpr std::size_t kCounted = 4;  // the first four of them
std::array<Communicator*, kCounted + 1> groups(Mesh& mesh) {
  return {&mesh.tp(), &mesh.pp(), &mesh.replicas(), &mesh.cp(), &mesh.world()};
}

// `field` (bytes, or inter-node bytes) of all ops, summed for the tp, pp, replica and cp
// groups since `start`.
GroupBytes per_group_since(Mesh& mesh,
                           const std::array<CommCounters, kCounted + 1>& start,
                           std::int64_t OpCounter::*field) {
  const auto all = groups(mesh);
  GroupBytes bytes{};
  for (std::size_t g = 0; g < bytes.size(); ++g) {
    for (const OpCounter& op : all[g]->counters().since(start[g]).ops) bytes[g] += op.*field;
  }
  return bytes;
}

}  // namespace

GroupTraffic::GroupTraffic(Runtime& runtime) : runtime_(&runtime) {
  const auto all = groups(runtime.mesh());
  for (std::size_t g = 0; g < all.size(); ++g) start_[g] = all[g]->counters();
}

GroupBytes GroupTraffic::bytes_since() const {
  return per_group_since(runtime_->mesh(), start_, &OpCounter::bytes);
}

GroupBytes GroupTraffic::inter_node_bytes_since() const {
  return per_group_since(runtime_->mesh(), start_, &OpCounter::inter_node_bytes);
}

std::string GroupTraffic::report(Runtime& runtime,
                                 const ModelStateBytes& held,
                                 std::int64_t elements,
                                 std::int64_t padding) const {
  Mesh& mesh = runtime.mesh();
  const proto::Plan& plan = runtime.plan();
  // ZeRO shards over the replicas: dp × cp ranks.
  const ModelStateBytes formula =
      model_state_formula(elements, padding, mesh.replicas().size(), zero_options(plan).stage,
                          precision_options(plan).dtype, optimizer_bytes_per_element(runtime.config().optimizer));
  const GroupBytes moved = bytes_since();
  const GroupBytes across = inter_node_bytes_since();
  // Each rank's sends within its node and to others: its groups and the world.
  NodeSplit counted;
  const auto all = groups(mesh);
  for (std::size_t g = 0; g < all.size(); ++g) {
    const NodeSplit split = sent_by_node(all[g]->counters().since(start_[g]));
    counted.intra_node_bytes += split.intra_node_bytes;
    counted.inter_node_bytes += split.inter_node_bytes;
  }
  // held and formula (3 each), moved and across (kCounted each), intra- and inter-node.
  constexpr int kFields = 6 + 2 * static_cast<int>(kCounted) + 2;
  std::vector<std::int64_t> mine{held.params,    held.grads,    held.optimizer,
                                 formula.params, formula.grads, formula.optimizer};
  mine.insert(mine.end(), moved.begin(), moved.end());
  mine.insert(mine.end(), across.begin(), across.end());
  mine.insert(mine.end(), {counted.intra_node_bytes, counted.inter_node_bytes});
  Communicator& telemetry = runtime.telemetry();
  at::Tensor row = at::empty({kFields}, at::kLong);
  for (int i = 0; i < kFields; ++i) row[i] = mine[static_cast<std::size_t>(i)];
  at::Tensor rows = at::empty({telemetry.size(), kFields}, at::kLong);
  telemetry.all_gather(rows, row)->wait();
  if (telemetry.rank() != 0) return "";
  // The cp column only with context parallelism; the replicas are then dp × cp.
  const bool cp = mesh.degrees().cp > 1;
  std::ostringstream out;
  char line[400];
  out << "model state per rank (bytes; ZeRO formula in parentheses) and bytes each group moved in the step (of them, "
         "to other nodes in parentheses):\n";
  std::snprintf(line, sizeof(line), "  %-5s %-24s %-24s %-24s %-20s %-20s %s\n", "rank", "params", "grads", "optimizer",
                "tp group", "pp group",
                trailing_group_columns(cp, cp ? "dp x cp group" : "dp group", "cp group").c_str());
  out << line;
  const auto* v = rows.data_ptr<std::int64_t>();
  auto pair = [](std::int64_t a, std::int64_t b) { return std::to_string(a) + " (" + std::to_string(b) + ")"; };
  constexpr int kMoved = 6, kAcross = kMoved + static_cast<int>(kCounted);
  for (int r = 0; r < telemetry.size(); ++r) {
    const std::int64_t* f = v + static_cast<std::ptrdiff_t>(r) * kFields;
    std::snprintf(
        line, sizeof(line), "  %-5d %-24s %-24s %-24s %-20s %-20s %s\n", r, pair(f[0], f[3]).c_str(),
        pair(f[1], f[4]).c_str(), pair(f[2], f[5]).c_str(), pair(f[kMoved], f[kAcross]).c_str(),
        pair(f[kMoved + 1], f[kAcross + 1]).c_str(),
        trailing_group_columns(cp, pair(f[kMoved + 2], f[kAcross + 2]), pair(f[kMoved + 3], f[kAcross + 3])).c_str());
    out << line;
  }
  if (runtime.cluster().num_nodes() > 1) {
    out << "bytes each rank sent in the step within its node and to other nodes (a collective over a group spanning "
           "nodes counts whole):\n";
    std::snprintf(line, sizeof(line), "  %-5s %-16s %s\n", "rank", "intra-node", "inter-node");
    out << line;
    for (int r = 0; r < telemetry.size(); ++r) {
      const std::int64_t* f = v + static_cast<std::ptrdiff_t>(r) * kFields;
      std::snprintf(line, sizeof(line), "  %-5d %-16lld %lld\n", r, static_cast<long long>(f[kFields - 2]),
                    static_cast<long long>(f[kFields - 1]));
      out << line;
    }
  }
  return out.str();
}

}  // namespace parallax
