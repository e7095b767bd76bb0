#include "parallax/zero/group_plan.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "parallax/core/error.h"
#include "parallax/zero/shard_layout.h"

namespace parallax::zero {
namespace {

// "BlockImpl" is matched by "Block" and "BlockImpl"; "torch::nn::LinearImpl" also by
// "Linear", "LinearImpl" and "torch::nn::Linear".
bool type_matches(const std::string& type, const std::string& wanted) {
  for (const std::string& candidate : {wanted, wanted + "Impl"}) {
    if (type == candidate) return true;
    if (type.size() > candidate.size() + 2 &&
        type.compare(type.size() - candidate.size(), candidate.size(), candidate) == 0 &&
        type.compare(type.size() - candidate.size() - 2, 2, "::") == 0) {
      return true;
    }
  }
  return false;
}

// Units: modules in reverse pre-order (children before their parents, later blocks
// first, close to the order backward finishes them); each claims its parameters not yet
// claimed. The root unit takes what is left. Marks the parameters it places in `claimed`.
std::vector<std::vector<std::size_t>> plan_units(torch::nn::Module& model,
                                                 const std::vector<torch::Tensor>& params,
                                                 const ZeroOptions& options,
                                                 std::unordered_set<std::size_t>& claimed) {
  std::unordered_map<const void*, std::size_t> index_of;
  for (std::size_t i = 0; i < params.size(); ++i) index_of[params[i].unsafeGetTensorImpl()] = i;
  std::vector<std::vector<std::size_t>> units;
  auto modules = model.modules(/*include_self=*/false);
  std::vector<bool> wrap_used(options.wrap.size(), false);
  for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
    std::vector<std::size_t> unclaimed;
    for (const auto& p : (*it)->parameters()) {
      const auto found = index_of.find(p.unsafeGetTensorImpl());
      if (found != index_of.end() && !claimed.count(found->second)) unclaimed.push_back(found->second);
    }
    if (unclaimed.empty()) continue;
    bool wrap = false;
    for (std::size_t w = 0; w < options.wrap.size(); ++w) {
      if (type_matches((*it)->name(), options.wrap[w])) wrap = wrap_used[w] = true;
    }
    std::int64_t count = 0;
    for (std::size_t i : unclaimed) count += params[i].numel();
    if (options.wrap_min_params > 0 && count >= options.wrap_min_params) wrap = true;
    if (!wrap) continue;
    std::vector<std::size_t> unit;
    for (std::size_t i : unclaimed) {
      if (claimed.insert(i).second) unit.push_back(i);
    }
    units.push_back(std::move(unit));
  }
  for (std::size_t w = 0; w < options.wrap.size(); ++w) {
    PARALLAX_CHECK(wrap_used[w], ConfigError, "zero.wrap: no module of type \"", options.wrap[w],
                   "\" holds trainable parameters (the root module is ", model.name(),
                   "); name a type from the model, e.g. the one of its repeated blocks");
  }
  std::vector<std::size_t> root;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!claimed.count(i)) root.push_back(i);
  }
  if (!root.empty()) units.push_back(std::move(root));
  return units;
}

std::vector<std::string> name_units(torch::nn::Module& model,
                                    const std::vector<torch::Tensor>& params,
                                    const std::vector<std::vector<std::size_t>>& units) {
  std::unordered_map<const void*, std::string> names;
  for (const auto& item : model.named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  std::vector<std::string> out;
  for (const auto& unit : units) {
    const auto found = names.find(params[unit.front()].unsafeGetTensorImpl());
    std::string name = found == names.end() ? "a parameter" : "'" + found->second + "'";
    if (unit.size() > 1) name += " and " + std::to_string(unit.size() - 1) + " more";
    out.push_back(std::move(name));
  }
  return out;
}

}  // namespace

GroupPlan plan_groups(torch::nn::Module& model, const std::vector<torch::Tensor>& params, const ZeroOptions& options) {
  GroupPlan plan;
  std::vector<std::size_t> replicated;
  if (options.stage == 3) {
    std::unordered_set<std::size_t> claimed;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].numel() <= options.persistence_threshold) {
        replicated.push_back(i);
        claimed.insert(i);
      }
    }
    plan.units = plan_units(model, params, options, claimed);
    plan.unit_names = name_units(model, params, plan.units);
  } else {
    for (std::size_t i = params.size(); i-- > 0;) replicated.push_back(i);
  }
  std::vector<std::int64_t> bytes;
  for (std::size_t i : replicated) bytes.push_back(params[i].numel() * 4);
  const std::int64_t cap = std::min(options.bucket_bytes(), kMaxGroupElements * 4);
  for (const auto& members : group_by_bytes(bytes, cap)) {
    std::vector<std::size_t> set;
    for (std::size_t m : members) set.push_back(replicated[m]);
    plan.replicated.push_back(std::move(set));
  }
  return plan;
}

}  // namespace parallax::zero
