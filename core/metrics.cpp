#include "parallax/core/metrics.h"

#include <cmath>
#include <iomanip>
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
  out << ",\"tokens_per_s\":";
  write_number(out, m.tokens_per_s);
  out << ",\"grad_norm\":";
  write_number(out, m.grad_norm);
  out << ",\"model_state_bytes\":[";
  for (std::size_t r = 0; r < m.model_state_bytes.size(); ++r) {
    const ModelStateBytes& b = m.model_state_bytes[r];
    out << (r ? "," : "") << "{\"params\":" << b.params << ",\"grads\":" << b.grads << ",\"optimizer\":" << b.optimizer
        << ",\"host\":" << b.host << ",\"nvme\":" << b.nvme << "}";
  }
  out << "],\"comm\":[";
  for (std::size_t r = 0; r < m.comm.size(); ++r) {
    out << (r ? "," : "") << "{";
    bool first = true;
    for (std::size_t op = 0; op < kCommOpCount; ++op) {
      const OpCounter& c = m.comm[r].ops[op];
      out << (first ? "" : ",") << "\"" << to_string(static_cast<CommOp>(op)) << "\":{\"calls\":" << c.calls
          << ",\"bytes\":" << c.bytes << "}";
      first = false;
    }
    out << "}";
  }
  out << "]";
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

MetricsWriter::MetricsWriter(const std::string& path) : path_(path), out_(path, std::ios::trunc) {
  PARALLAX_CHECK(out_.good(), UsageError, "cannot open logging.metrics_file '", path, "' for writing");
}

void MetricsWriter::write(const StepMetrics& metrics) {
  out_ << to_json_line(metrics) << '\n';
  out_.flush();
  PARALLAX_CHECK(out_.good(), UsageError, "failed writing logging.metrics_file '", path_, "'");
}

}  // namespace parallax
