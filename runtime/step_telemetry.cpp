#include "parallax/runtime/step_telemetry.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "parallax/core/cpu_memory_meter.h"
#include "parallax/core/error.h"
#include "parallax/core/mesh.h"
#include "parallax/core/resident_memory.h"
#include "parallax/core/world.h"
#include "parallax/runtime/auto_layout.h"
#include "parallax/runtime/layer_profile.h"
#include "parallax/runtime/plan_options.h"
#include "proto/plan.pb.h"

namespace parallax {
namespace {

constexpr std::int64_t kStateFields = 10;  // loss, the ModelStateBytes fields, pipeline compute and schedule ms,
                                            // peak allocated and resident bytes
constexpr std::int64_t kCommFields = 3;     // per op: calls, bytes, inter-node bytes
constexpr std::int64_t kRoutingFields = 8;  // RoutingActivity's
constexpr std::int64_t kRoutingAt = kStateFields + kCommFields * static_cast<std::int64_t>(kCommOpCount);
constexpr std::int64_t kFieldsPerRank = kRoutingAt + kRoutingFields;

std::string human_rate(double per_second) {
  char text[32];
  if (per_second >= 1e6) {
    std::snprintf(text, sizeof(text), "%.2fM", per_second / 1e6);
  } else if (per_second >= 1e3) {
    std::snprintf(text, sizeof(text), "%.1fk", per_second / 1e3);
  } else {
    std::snprintf(text, sizeof(text), "%.1f", per_second);
  }
  return text;
}

}  // namespace

StepTelemetry::StepTelemetry(Runtime& runtime, const proto::Plan& plan)
    : runtime_(runtime), batch_(batch_options(plan)) {
  Mesh& mesh = runtime.mesh();
  for (Communicator* c :
       {&mesh.world(), &mesh.dp(), &mesh.tp(), &mesh.pp(), &mesh.cp(), &mesh.replicas(), &mesh.expert_replicas()}) {
    if (std::find(training_comms_.begin(), training_comms_.end(), c) == training_comms_.end()) {
      training_comms_.push_back(c);
    }
  }
  if (mesh.degrees().ep > 1) training_comms_.push_back(&mesh.expert());
}

StepTelemetry::~StepTelemetry() = default;

CommCounters StepTelemetry::training_counters() const {
  CommCounters total;
  for (const Communicator* c : training_comms_) total += c->counters();
  return total;
}

void StepTelemetry::begin_window_if_needed() {
  if (window_open_) return;
  window_open_ = true;
  window_start_ = std::chrono::steady_clock::now();
  counters_at_start_ = training_counters();
  if (CpuMemoryMeter* meter = runtime_.memory_meter()) meter->reset_peak();
  // The run's peak keeps what came before this window (construction, earlier steps).
  run_resident_peak_ = std::max(run_resident_peak_, resident_peak_bytes());
  resident_peak_reset_ = reset_resident_peak();
}

StepMetrics StepTelemetry::end_window(
    std::int64_t step, double local_loss, double lr, double grad_norm, const ModelStateBytes& state) {
  const CommCounters delta = training_counters().since(counters_at_start_);
  window_open_ = false;

  at::Tensor mine = at::empty({kFieldsPerRank}, at::kDouble);
  double* m = mine.data_ptr<double>();
  m[0] = local_loss;
  m[1] = static_cast<double>(state.params);
  m[2] = static_cast<double>(state.grads);
  m[3] = static_cast<double>(state.optimizer);
  m[4] = static_cast<double>(state.host);
  m[5] = static_cast<double>(state.nvme);
  m[6] = compute_ms_;
  m[7] = schedule_ms_;
  compute_ms_ = schedule_ms_ = -1.0;
  const CpuMemoryMeter* meter = runtime_.memory_meter();
  m[8] = meter != nullptr ? static_cast<double>(meter->peak_bytes()) : -1.0;
  const std::int64_t resident_peak = resident_peak_bytes();
  run_resident_peak_ = std::max(run_resident_peak_, resident_peak);
  m[9] = resident_peak_reset_ ? static_cast<double>(resident_peak) : -1.0;
  for (std::size_t op = 0; op < kCommOpCount; ++op) {
    m[kStateFields + kCommFields * op] = static_cast<double>(delta.ops[op].calls);
    m[kStateFields + kCommFields * op + 1] = static_cast<double>(delta.ops[op].bytes);
    m[kStateFields + kCommFields * op + 2] = static_cast<double>(delta.ops[op].inter_node_bytes);
  }
  double* routed = m + kRoutingAt;
  routed[0] = static_cast<double>(routing_.layers);
  routed[1] = static_cast<double>(routing_.forwards);
  routed[2] = routing_.aux_loss;
  routed[3] = routing_.balance_loss;
  routed[4] = routing_.z_loss;
  routed[5] = static_cast<double>(routing_.choices);
  routed[6] = static_cast<double>(routing_.dropped);
  routed[7] = routing_.imbalance;
  routing_ = RoutingActivity();

  Communicator& telemetry = runtime_.telemetry();
  telemetry.set_step(step);
  const int ranks = telemetry.size();
  at::Tensor all = at::empty({ranks * kFieldsPerRank}, at::kDouble);
  telemetry.all_gather(all, mine)->wait();

  StepMetrics metrics;
  metrics.step = step;
  metrics.lr = lr;
  metrics.grad_norm = grad_norm;
  const double* a = all.data_ptr<double>();
  double loss_sum = 0.0;
  for (int r = 0; r < ranks; ++r) {
    const double* f = a + r * kFieldsPerRank;
    loss_sum += f[0];
    metrics.model_state_bytes.push_back({static_cast<std::int64_t>(f[1]), static_cast<std::int64_t>(f[2]),
                                         static_cast<std::int64_t>(f[3]), static_cast<std::int64_t>(f[4]),
                                         static_cast<std::int64_t>(f[5])});
    metrics.peak_memory.push_back({static_cast<std::int64_t>(f[8]), static_cast<std::int64_t>(f[9])});
    CommCounters counters;
    for (std::size_t op = 0; op < kCommOpCount; ++op) {
      counters.ops[op].calls = static_cast<std::int64_t>(f[kStateFields + kCommFields * op]);
      counters.ops[op].bytes = static_cast<std::int64_t>(f[kStateFields + kCommFields * op + 1]);
      counters.ops[op].inter_node_bytes = static_cast<std::int64_t>(f[kStateFields + kCommFields * op + 2]);
    }
    metrics.comm.push_back(counters);
  }
  metrics.loss = loss_sum / ranks;
  // Routing: every rank of a stage holds its layers (tp ranks route the same tokens alike).
  double layer_sum = 0.0, forwards = 0.0, choices = 0.0, dropped = 0.0;
  for (int r = 0; r < ranks; ++r) {
    const double* routed = a + r * kFieldsPerRank + kRoutingAt;
    layer_sum += routed[0];
    forwards += routed[1];
    metrics.moe.aux_loss += routed[2];
    metrics.moe.balance_loss += routed[3];
    metrics.moe.z_loss += routed[4];
    choices += routed[5];
    dropped += routed[6];
    metrics.moe.imbalance = std::max(metrics.moe.imbalance, routed[7]);
  }
  metrics.moe.layers =
      std::llround(layer_sum * runtime_.mesh().degrees().pp / static_cast<double>(runtime_.mesh().world().size()));
  if (forwards > 0) {
    metrics.moe.aux_loss /= forwards;
    metrics.moe.balance_loss /= forwards;
    metrics.moe.z_loss /= forwards;
  }
  metrics.moe.dropped_fraction = choices > 0 ? dropped / choices : 0.0;
  double longest_schedule = -1.0;
  for (int r = 0; r < ranks; ++r) longest_schedule = std::max(longest_schedule, a[r * kFieldsPerRank + 7]);
  if (longest_schedule > 0) {
    for (int r = 0; r < ranks; ++r) {
      const double compute = a[r * kFieldsPerRank + 6];
      metrics.bubble_fraction.push_back(compute >= 0 ? 1.0 - compute / longest_schedule : -1.0);
    }
  }
  const auto elapsed = std::chrono::steady_clock::now() - window_start_;
  metrics.step_ms = std::chrono::duration<double, std::milli>(elapsed).count();
  metrics.predicted_step_ms = runtime_.auto_layout().predicted_step_ms();
  const double samples = static_cast<double>(batch_.global_batch_size);
  metrics.samples_per_s = metrics.step_ms > 0 ? samples * 1000.0 / metrics.step_ms : 0.0;
  metrics.tokens_per_sample = tokens_per_sample_;
  metrics.tokens_per_s = metrics.samples_per_s * static_cast<double>(std::max<std::int64_t>(tokens_per_sample_, 1));
  if (first_window_done_) {
    timed_ms_ += metrics.step_ms;
    ++timed_windows_;
  }
  first_window_done_ = true;

  // A full disk must not stop training on rank 0 alone (its peers would wait in the next
  // step's collectives): the writer reports a failed sink once and closes it.
  if (MetricsWriter* writer = runtime_.metrics_writer(); writer != nullptr && writer->open()) {
    try {
      writer->write(metrics);
    } catch (const Error& e) {
      runtime_.logger().error(e.detail());
    }
  }
  const LoggingOptions& logging = runtime_.config().logging;
  const std::int64_t total = batch_.steps;
  if (logging.every > 0 && (step % logging.every == 0 || step == total || step == 1)) {
    const bool tokens = tokens_per_sample_ > 0;
    char line[256];
    std::snprintf(line, sizeof(line), "step %lld/%lld | loss %.4f | lr %.3e | %.1f ms/step | %s %s",
                  static_cast<long long>(step), static_cast<long long>(total), metrics.loss, lr, metrics.step_ms,
                  human_rate(tokens ? metrics.tokens_per_s : metrics.samples_per_s).c_str(),
                  tokens ? "tok/s" : "samples/s");
    char norm[48] = "";
    if (grad_norm >= 0 || !std::isfinite(grad_norm)) std::snprintf(norm, sizeof(norm), " | grad norm %.3g", grad_norm);
    std::string eta;
    if (timed_windows_ > 0 && total > step) {
      eta = " | ETA " + human_duration(static_cast<double>(total - step) * timed_ms_ / timed_windows_ / 1000.0);
    }
    // The fullest rank's peaks: resident (what the machine sees) and LibTorch's tensors.
    std::int64_t resident = -1, allocated = -1;
    for (const PeakMemory& peak : metrics.peak_memory) {
      resident = std::max(resident, peak.resident);
      allocated = std::max(allocated, peak.allocated);
    }
    std::string memory;
    if (resident >= 0 || allocated >= 0) {
      memory = " | peak mem " + (resident >= 0 ? human_bytes(resident) : std::string("?")) +
               (allocated >= 0 ? " (tensors " + human_bytes(allocated) + ")" : "");
    }
    char routing[64] = "";
    if (metrics.moe.layers > 0) {
      std::snprintf(routing, sizeof(routing), " | aux %.4f | imbalance %.2f", metrics.moe.aux_loss,
                    metrics.moe.imbalance);
      if (metrics.moe.dropped_fraction > 0)
        std::snprintf(routing + std::strlen(routing), sizeof(routing) - std::strlen(routing), " | dropped %.1f%%",
                      100.0 * metrics.moe.dropped_fraction);
    }
    runtime_.logger().summary(line, norm, memory, routing, eta);
  }
  // Every auto run checks the planner's model: the prediction against the mean of the
  // steps after the first (which builds and warms up).
  if (metrics.predicted_step_ms > 0 && step == total && timed_windows_ > 0) {
    const double measured = timed_ms_ / static_cast<double>(timed_windows_);
    char line[360];
    std::snprintf(line, sizeof(line),
                  "auto layout check: predicted %.2f ms/step, measured %.2f ms/step (mean of %lld steps after the "
                  "first): the prediction is %+.0f%% off",
                  metrics.predicted_step_ms, measured, static_cast<long long>(timed_windows_),
                  100.0 * (metrics.predicted_step_ms - measured) / measured);
    runtime_.logger().summary(line);
    const AutoLayout& chosen = runtime_.auto_layout();
    if (runtime_.mesh().world().rank() == 0 && !chosen.profile_file.empty()) {
      // The next run's correction counts this one (the model's own error, uncorrected).
      const std::string problem = record_step_time_ratio(chosen.profile_file, measured / chosen.model_step_ms);
      if (!problem.empty()) runtime_.logger().summary("auto layout check: the ratio was not recorded: ", problem);
    }
    const double peak_mb = static_cast<double>(run_resident_peak_ - chosen.resident_bytes) / 1e6;
    const double predicted_mb = static_cast<double>(chosen.predicted_bytes) / 1e6;
    const Malloc malloc = this_malloc();
    std::snprintf(line, sizeof(line),
                  "auto layout check: predicted %.1f MB per rank, measured %.1f MB (rank 0's peak resident memory "
                  "since planning less its resident memory before): %+.0f%%; %s%s",
                  predicted_mb, peak_mb, peak_mb > 0 ? 100.0 * (predicted_mb - peak_mb) / peak_mb : 0.0,
                  to_string(malloc),
                  malloc == Malloc::kGlibc ? ", which keeps freed buffers resident (docs/planner.md)" : "");
    runtime_.logger().summary(line);
  }
  return metrics;
}

}  // namespace parallax
