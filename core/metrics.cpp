#include "parallax/core/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iterator>
#include <sstream>

#include "parallax/core/error.h"

namespace parallax {
namespace {

// JSON has no NaN/Infinity: a diverged loss is written as null.
void write_number(std::ostringstream& out, double value) {
  if (std::isfinite(value)) {
    out << value;
  } else {
    out << "null";
  }
}

}  // namespace

std::string to_json_line(const StepMetrics& m) {
  std::ostringstream out;
  out << std::setprecision(9);
  out << "{\"step\":" << m.step << ",\"loss\":";
  write_number(out, m.loss);
  out << ",\"lr\":";
  write_number(out, m.lr);
  out << ",\"step_ms\":";
  write_number(out, m.step_ms);
  if (m.predicted_step_ms > 0) {
    out << ",\"predicted_step_ms\":";
    write_number(out, m.predicted_step_ms);
  }
  out << ",\"tokens_per_s\":";
  write_number(out, m.tokens_per_s);
  out << ",\"samples_per_s\":";
  write_number(out, m.samples_per_s);
  out << ",\"grad_norm\":";
  write_number(out, m.grad_norm);
  out << ",\"model_state_bytes\":[";
  for (std::size_t r = 0; r < m.model_state_bytes.size(); ++r) {
    const ModelStateBytes& b = m.model_state_bytes[r];
    out << (r ? "," : "") << "{\"params\":" << b.params << ",\"grads\":" << b.grads << ",\"optimizer\":" << b.optimizer
        << ",\"host\":" << b.host << ",\"nvme\":" << b.nvme << "}";
  }
  out << "]";
  if (!m.peak_memory.empty()) {
    out << ",\"peak_memory\":[";
    for (std::size_t r = 0; r < m.peak_memory.size(); ++r) {
      out << (r ? "," : "") << "{\"allocated\":" << m.peak_memory[r].allocated
          << ",\"resident\":" << m.peak_memory[r].resident << "}";
    }
    out << "]";
  }
  out << ",\"comm\":[";
  for (std::size_t r = 0; r < m.comm.size(); ++r) {
    out << (r ? "," : "") << "{";
    bool first = true;
    for (std::size_t op = 0; op < kCommOpCount; ++op) {
      const OpCounter& c = m.comm[r].ops[op];
      out << (first ? "" : ",") << "\"" << to_string(static_cast<CommOp>(op)) << "\":{\"calls\":" << c.calls
          << ",\"bytes\":" << c.bytes << ",\"inter_node_bytes\":" << c.inter_node_bytes << "}";
      first = false;
    }
    out << "}";
  }
  out << "]";
  if (m.moe.layers > 0) {
    out << ",\"moe\":{\"layers\":" << m.moe.layers << ",\"aux_loss\":";
    write_number(out, m.moe.aux_loss);
    out << ",\"balance_loss\":";
    write_number(out, m.moe.balance_loss);
    out << ",\"z_loss\":";
    write_number(out, m.moe.z_loss);
    out << ",\"dropped_fraction\":";
    write_number(out, m.moe.dropped_fraction);
    out << ",\"imbalance\":";
    write_number(out, m.moe.imbalance);
    out << "}";
  }
  if (!m.bubble_fraction.empty()) {
    out << ",\"bubble_fraction\":[";
    for (std::size_t r = 0; r < m.bubble_fraction.size(); ++r) {
      out << (r ? "," : "");
      write_number(out, m.bubble_fraction[r]);
    }
    out << "]";
  }
  out << "}";
  return out.str();
}

NodeSplit sent_by_node(const CommCounters& counters) {
  NodeSplit split;
  for (std::size_t op = 0; op < kCommOpCount; ++op) {
    if (static_cast<CommOp>(op) == CommOp::kRecv) continue;
    split.inter_node_bytes += counters.ops[op].inter_node_bytes;
    split.intra_node_bytes += counters.ops[op].bytes - counters.ops[op].inter_node_bytes;
  }
  return split;
}

std::vector<TensorBoardScalar> tensorboard_scalars(const StepMetrics& m) {
  std::vector<TensorBoardScalar> scalars = {{"train/loss", m.loss}, {"train/lr", m.lr}};
  if (m.grad_norm >= 0 || !std::isfinite(m.grad_norm)) scalars.push_back({"train/grad_norm", m.grad_norm});
  scalars.push_back({"perf/step_ms", m.step_ms});
  if (m.predicted_step_ms > 0) scalars.push_back({"perf/predicted_step_ms", m.predicted_step_ms});
  scalars.push_back({"perf/samples_per_s", m.samples_per_s});
  if (m.tokens_per_sample > 0) scalars.push_back({"perf/tokens_per_s", m.tokens_per_s});
  for (std::size_t r = 0; r < m.model_state_bytes.size(); ++r) {
    const ModelStateBytes& b = m.model_state_bytes[r];
    const double total = static_cast<double>(b.params + b.grads + b.optimizer + b.host + b.nvme);
    scalars.push_back({"memory/rank" + std::to_string(r) + "_bytes", total});
    if (r < m.peak_memory.size() && m.peak_memory[r].allocated >= 0) {
      scalars.push_back({"memory/rank" + std::to_string(r) + "_peak_allocated_bytes",
                         static_cast<double>(m.peak_memory[r].allocated)});
    }
    if (r < m.peak_memory.size() && m.peak_memory[r].resident >= 0) {
      scalars.push_back({"memory/rank" + std::to_string(r) + "_peak_resident_bytes",
                         static_cast<double>(m.peak_memory[r].resident)});
    }
  }
  if (!m.comm.empty()) {
    for (std::size_t op = 0; op < kCommOpCount; ++op) {
      std::int64_t bytes = 0;
      for (const CommCounters& rank : m.comm) bytes += rank.ops[op].bytes;
      scalars.push_back(
          {std::string("comm/") + to_string(static_cast<CommOp>(op)) + "_bytes", static_cast<double>(bytes)});
    }
    NodeSplit total;
    for (const CommCounters& rank : m.comm) {
      const NodeSplit sent = sent_by_node(rank);
      total.intra_node_bytes += sent.intra_node_bytes;
      total.inter_node_bytes += sent.inter_node_bytes;
    }
    scalars.push_back({"comm/intra_node_bytes", static_cast<double>(total.intra_node_bytes)});
    scalars.push_back({"comm/inter_node_bytes", static_cast<double>(total.inter_node_bytes)});
  }

  for (std::size_t r = 0; r < m.bubble_fraction.size(); ++r) {
    scalars.push_back({"pipeline/rank" + std::to_string(r) + "_bubble_fraction", m.bubble_fraction[r]});
  }
  if (m.moe.layers > 0) {
    scalars.push_back({"moe/aux_loss", m.moe.aux_loss});
    scalars.push_back({"moe/balance_loss", m.moe.balance_loss});
    scalars.push_back({"moe/z_loss", m.moe.z_loss});
    scalars.push_back({"moe/dropped_fraction", m.moe.dropped_fraction});
    scalars.push_back({"moe/imbalance", m.moe.imbalance});
  }
  return scalars;
}

std::string human_bytes(std::int64_t bytes) {
  if (bytes < 0) return "?";
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), value < 10.0 ? "%.2f %s" : value < 100.0 ? "%.1f %s" : "%.0f %s", value,
                units[unit]);
  return text;
}

std::string human_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<long long>(std::llround(seconds));
  char text[32];
  if (total < 60) {
    std::snprintf(text, sizeof(text), "%llds", total);
  } else if (total < 3600) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", total / 60, total % 60);
  } else {
    // Minutes rounded, so 1h59m59s reads 2h00m, not 1h60m.
    const long long minutes = (total + 30) / 60;
    std::snprintf(text, sizeof(text), "%lldh%02lldm", minutes / 60, minutes % 60);
  }
  return text;
}

MetricsWriter::MetricsWriter(const std::string& json_path, const std::string& tensorboard_dir) : json_path_(json_path) {
  if (!json_path.empty()) {
    json_.open(json_path, std::ios::trunc);
    PARALLAX_CHECK(json_.good(), UsageError, "cannot open logging.metrics_file '", json_path,
                   "' for writing: ", std::strerror(errno));
  }
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
}

void MetricsWriter::write(const StepMetrics& metrics) {
  std::string failures;
  if (json_.is_open()) {
    json_ << to_json_line(metrics) << '\n';
    json_.flush();
    if (!json_.good()) {
      json_.close();
      failures = "failed writing logging.metrics_file '" + json_path_ + "'; it is closed";
    }
  }
  if (tensorboard_) {
    try {
      tensorboard_->add_scalars(metrics.step, tensorboard_scalars(metrics));
    } catch (const Error& e) {
      tensorboard_.reset();
      failures += (failures.empty() ? "" : "; ") + e.detail() + "; it is closed";
    }
  }
  PARALLAX_CHECK(failures.empty(), UsageError, failures);
}

}  // namespace parallax
