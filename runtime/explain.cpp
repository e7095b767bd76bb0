#include "parallax/runtime/explain.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <sstream>

#include "parallax/core/mesh.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"

namespace parallax {
namespace {

std::array<Communicator*, 4> groups(Mesh& mesh) {
  return {&mesh.tp(), &mesh.pp(), &mesh.dp(), &mesh.world()};
}

// `field` (bytes, or inter-node bytes) of all ops, summed for the tp, pp and dp groups
// since `start`.
std::array<std::int64_t, 3> per_group_since(Mesh& mesh,
                                            const std::array<CommCounters, 4>& start,
                                            std::int64_t OpCounter::*field) {
  const std::array<Communicator*, 4> all = groups(mesh);
  std::array<std::int64_t, 3> bytes{};
  for (std::size_t g = 0; g < bytes.size(); ++g) {
    for (const OpCounter& op : all[g]->counters().since(start[g]).ops) bytes[g] += op.*field;
  }
  return bytes;
}

}  // namespace

GroupTraffic::GroupTraffic(Runtime& runtime) : runtime_(&runtime) {
  const std::array<Communicator*, 4> all = groups(runtime.mesh());
  for (std::size_t g = 0; g < all.size(); ++g) start_[g] = all[g]->counters();
}

std::array<std::int64_t, 3> GroupTraffic::bytes_since() const {
  return per_group_since(runtime_->mesh(), start_, &OpCounter::bytes);
}

std::array<std::int64_t, 3> GroupTraffic::inter_node_bytes_since() const {
  return per_group_since(runtime_->mesh(), start_, &OpCounter::inter_node_bytes);
}

std::string GroupTraffic::report(Runtime& runtime,
                                 const ModelStateBytes& held,
                                 std::int64_t elements,
                                 std::int64_t padding) const {
  Mesh& mesh = runtime.mesh();
  const proto::Plan& plan = runtime.plan();
  const ModelStateBytes formula =
      model_state_formula(elements, padding, mesh.degrees().dp, zero_options(plan).stage, precision_options(plan).dtype,
                          optimizer_bytes_per_element(runtime.config().optimizer));
  const std::array<std::int64_t, 3> moved = bytes_since();
  const std::array<std::int64_t, 3> across = inter_node_bytes_since();
  // Each rank's sends within its node and to others: the tp, pp and dp groups and the world.
  NodeSplit counted;
  const std::array<Communicator*, 4> all = groups(mesh);
  for (std::size_t g = 0; g < all.size(); ++g) {
    const NodeSplit split = sent_by_node(all[g]->counters().since(start_[g]));
    counted.intra_node_bytes += split.intra_node_bytes;
    counted.inter_node_bytes += split.inter_node_bytes;
  }
  constexpr int kFields = 14;
  const std::int64_t mine[kFields] = {held.params, held.grads,        held.optimizer, formula.params,
                                      formula.grads, formula.optimizer, moved[0],       moved[1],
                                      moved[2],    across[0],         across[1],      across[2],
                                      counted.intra_node_bytes, counted.inter_node_bytes};
  Communicator& telemetry = runtime.telemetry();
  at::Tensor row = at::empty({kFields}, at::kLong);
  for (int i = 0; i < kFields; ++i) row[i] = mine[i];
  at::Tensor rows = at::empty({telemetry.size(), kFields}, at::kLong);
  telemetry.all_gather(rows, row)->wait();
  if (telemetry.rank() != 0) return "";
  std::ostringstream out;
  char line[320];
  out << "model state per rank (bytes; ZeRO formula in parentheses) and bytes each group moved in the step (of them, "
         "to other nodes in parentheses):\n";
  std::snprintf(line, sizeof(line), "  %-5s %-24s %-24s %-24s %-20s %-20s %s\n", "rank", "params", "grads", "optimizer",
                "tp group", "pp group", "dp group");
  out << line;
  const auto* v = rows.data_ptr<std::int64_t>();
  auto pair = [](std::int64_t a, std::int64_t b) { return std::to_string(a) + " (" + std::to_string(b) + ")"; };
  for (int r = 0; r < telemetry.size(); ++r) {
    const std::int64_t* f = v + static_cast<std::ptrdiff_t>(r) * kFields;
    std::snprintf(line, sizeof(line), "  %-5d %-24s %-24s %-24s %-20s %-20s %s\n", r, pair(f[0], f[3]).c_str(),
                  pair(f[1], f[4]).c_str(), pair(f[2], f[5]).c_str(), pair(f[6], f[9]).c_str(),
                  pair(f[7], f[10]).c_str(), pair(f[8], f[11]).c_str());
    out << line;
  }
  if (runtime.cluster().num_nodes() > 1) {
    out << "bytes each rank sent in the step within its node and to other nodes (a collective over a group spanning "
           "nodes counts whole):\n";
    std::snprintf(line, sizeof(line), "  %-5s %-16s %s\n", "rank", "intra-node", "inter-node");
    out << line;
    for (int r = 0; r < telemetry.size(); ++r) {
      const std::int64_t* f = v + static_cast<std::ptrdiff_t>(r) * kFields;
      std::snprintf(line, sizeof(line), "  %-5d %-16lld %lld\n", r, static_cast<long long>(f[12]),
                    static_cast<long long>(f[13]));
      out << line;
    }
  }
  return out.str();
}

}  // namespace parallax
