#include "parallax/runtime/explain.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <sstream>

#include "parallax/core/mesh.h"
#include "parallax/runtime/plan_options.h"
#include "parallax/runtime/runtime.h"

namespace parallax {
namespace {

std::int64_t total_bytes(const CommCounters& counters) {
  std::int64_t bytes = 0;
  for (const OpCounter& op : counters.ops) bytes += op.bytes;
  return bytes;
}

}  // namespace

GroupTraffic::GroupTraffic(Mesh& mesh)
    : mesh_(&mesh), start_{mesh.tp().counters(), mesh.pp().counters(), mesh.dp().counters()} {}

std::array<std::int64_t, 3> GroupTraffic::bytes_since() const {
  return {total_bytes(mesh_->tp().counters().since(start_[0])), total_bytes(mesh_->pp().counters().since(start_[1])),
          total_bytes(mesh_->dp().counters().since(start_[2]))};
}

std::string GroupTraffic::report(Runtime& runtime,
                                 const ModelStateBytes& held,
                                 std::int64_t elements,
                                 std::int64_t padding) const {
  const proto::Plan& plan = runtime.plan();
  const ModelStateBytes formula =
      model_state_formula(elements, padding, mesh_->degrees().dp, plan.zero().stage(), precision_options(plan).dtype,
                          optimizer_bytes_per_element(runtime.config().optimizer));
  const std::array<std::int64_t, 3> moved = bytes_since();
  constexpr int kFields = 9;
  const std::int64_t mine[kFields] = {held.params,       held.grads, held.optimizer, formula.params, formula.grads,
                                      formula.optimizer, moved[0],   moved[1],       moved[2]};
  Communicator& all = runtime.telemetry();
  at::Tensor row = at::empty({kFields}, at::kLong);
  for (int i = 0; i < kFields; ++i) row[i] = mine[i];
  at::Tensor rows = at::empty({all.size(), kFields}, at::kLong);
  all.all_gather(rows, row)->wait();
  if (all.rank() != 0) return "";
  std::ostringstream out;
  char line[256];
  out << "model state per rank (bytes; ZeRO formula in parentheses) and bytes each group moved in the step:\n";
  std::snprintf(line, sizeof(line), "  %-5s %-24s %-24s %-24s %-12s %-12s %s\n", "rank", "params", "grads", "optimizer",
                "tp group", "pp group", "dp group");
  out << line;
  const auto* v = rows.data_ptr<std::int64_t>();
  for (int r = 0; r < all.size(); ++r) {
    const std::int64_t* f = v + static_cast<std::ptrdiff_t>(r) * kFields;
    auto pair = [](std::int64_t a, std::int64_t b) { return std::to_string(a) + " (" + std::to_string(b) + ")"; };
    std::snprintf(line, sizeof(line), "  %-5d %-24s %-24s %-24s %-12lld %-12lld %lld\n", r, pair(f[0], f[3]).c_str(),
                  pair(f[1], f[4]).c_str(), pair(f[2], f[5]).c_str(), static_cast<long long>(f[6]),
                  static_cast<long long>(f[7]), static_cast<long long>(f[8]));
    out << line;
  }
  return out.str();
}

}  // namespace parallax
