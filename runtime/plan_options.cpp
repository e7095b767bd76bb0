#include "parallax/runtime/plan_options.h"

#include <map>

#include "parallax/core/config_loader.h"

namespace parallax {

void record_strategy(const Config& config, proto::Plan& plan) {
  const ParallelOptions& p = config.parallel;
  plan.mutable_degrees()->set_tp(p.tp);
  plan.mutable_degrees()->set_pp(p.pp);
  plan.mutable_degrees()->set_dp(p.dp);
  plan.mutable_degrees()->set_cp(p.cp);
  plan.mutable_degrees()->set_ep(p.ep);
  plan.set_axis_order(to_string(p.order));
  plan.set_comm_backend("mpi");
  plan.set_strategy(strategy_toml(config));
  plan.clear_positions();
  for (const auto& [key, position] : strategy_positions(config)) {
    proto::KeyPosition& recorded = *plan.add_positions();
    recorded.set_key(key);
    recorded.set_position(position);
  }
}

Config recorded_strategy(const proto::Plan& plan) {
  std::map<std::string, std::string> positions;
  for (const proto::KeyPosition& recorded : plan.positions()) positions[recorded.key()] = recorded.position();
  return strategy_config(plan.strategy(), positions);
}

TrainOptions batch_options(const proto::Plan& plan) {
  return recorded_strategy(plan).train;
}
ZeroOptions zero_options(const proto::Plan& plan) {
  return recorded_strategy(plan).zero;
}
OffloadOptions offload_options(const proto::Plan& plan) {
  return recorded_strategy(plan).offload;
}
PrecisionOptions precision_options(const proto::Plan& plan) {
  return recorded_strategy(plan).precision;
}
TensorParallelOptions tensor_parallel_options(const proto::Plan& plan) {
  return recorded_strategy(plan).tensor_parallel;
}
PipelineOptions pipeline_options(const proto::Plan& plan) {
  return recorded_strategy(plan).pipeline;
}

std::string recorded_position(const proto::Plan& plan, const std::string& key) {
  for (const proto::KeyPosition& recorded : plan.positions()) {
    if (recorded.key() == key) return recorded.position();
  }
  return "";
}

}  // namespace parallax
