// The planner's answers as text: a table for people, JSON for programs.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/planner/plan_search.h"

namespace parallax::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", static_cast<double>(bytes) / kGiB);
  return text;
}

std::string fixed(double value, int digits) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", ch);
      out += escaped;
      continue;
    }
    out += ch;
  }
  return out + "\"";
}

// `rank`, when given: the candidate's place among the plans that run and fit.
std::string candidate_json(const Candidate& c, std::optional<std::size_t> rank) {
  const Layout& l = c.layout;
  const MemoryEstimate& m = c.memory;
  const TimeEstimate& t = c.time;
  std::ostringstream out;
  out << "{\"layout\": " << json_string(l.describe()) << ", \"tp\": " << l.tp << ", \"pp\": " << l.pp
      << ", \"dp\": " << l.dp << ", \"zero_stage\": " << l.zero_stage << ", \"offload_optimizer\": "
      << json_string(to_string(l.offload_optimizer)) << ", \"offload_param\": " << json_string(to_string(l.offload_param))
      << ", \"schedule\": " << json_string(to_string(l.schedule)) << ", \"virtual_stages\": " << l.virtual_stages
      << ", \"recompute\": " << json_string(to_string(l.recompute)) << ", \"micro_batch_size\": " << l.micro_batch_size
      << ", \"grad_accum\": " << l.grad_accum << ", \"memory\": {\"stage\": " << m.stage
      << ", \"params\": " << m.state.params << ", \"grads\": " << m.state.grads << ", \"optimizer\": " << m.state.optimizer
      << ", \"activations\": " << m.activations << ", \"buffers\": " << m.buffers << ", \"device_total\": "
      << m.device_total() << ", \"host\": " << m.state.host << ", \"state_per_stage\": [";
  for (std::size_t s = 0; s < m.state_per_stage.size(); ++s) {
    const ModelStateBytes& b = m.state_per_stage[s];
    out << (s ? ", " : "") << "{\"params\": " << b.params << ", \"grads\": " << b.grads
        << ", \"optimizer\": " << b.optimizer << ", \"host\": " << b.host << "}";
  }
  out << "]}, \"time\": {\"pipeline_s\": " << t.pipeline
      << ", \"tensor_parallel_s\": " << t.tensor_parallel << ", \"bubble\": " << t.bubble
      << ", \"data_parallel_s\": " << t.data_parallel << ", \"optimizer_s\": " << t.optimizer
      << ", \"total_s\": " << t.total << ", \"mfu\": " << t.mfu << "}, \"refused\": " << json_string(c.refused)
      << ", \"does_not_fit\": " << json_string(c.does_not_fit);
  if (rank) out << ", \"rank\": " << *rank;
  out << "}";
  return out.str();
}

}  // namespace

std::string format_candidate(const Candidate& c) {
  const MemoryEstimate& m = c.memory;
  const TimeEstimate& t = c.time;
  std::ostringstream out;
  out << c.layout.describe() << "\n";
  if (!c.refused.empty()) out << "  refused by this build: " << c.refused << "\n";
  if (!c.does_not_fit.empty()) out << "  does not fit: " << c.does_not_fit << "\n";
  out << "  memory per device (stage " << m.stage << "): " << gib(m.device_total()) << " GiB = parameters "
      << gib(m.state.params) << " + gradients " << gib(m.state.grads) << " + optimizer " << gib(m.state.optimizer)
      << " + activations " << gib(m.activations) << " + buffers " << gib(m.buffers) << " GiB";
  if (m.state.host > 0) out << "; host " << gib(m.state.host) << " GiB";
  out << "\n  step time: " << fixed(t.total, 3) << " s = pipeline " << fixed(t.pipeline, 3) << " (tensor-parallel "
      << fixed(t.tensor_parallel, 3) << ", bubble " << fixed(100 * t.bubble, 1) << "%) + data-parallel "
      << fixed(t.data_parallel, 3) << " + optimizer " << fixed(t.optimizer, 3) << "; MFU " << fixed(100 * t.mfu, 1)
      << "%\n";
  return out.str();
}

std::string format_table(const PlanResult& result, std::size_t top) {
  std::ostringstream out;
  out << result.ranked.size() << " of " << result.scored << " layouts run and fit (searched in "
      << fixed(result.seconds, 3) << " s); the best " << std::min(top, result.ranked.size()) << ":\n";
  const std::size_t shown = std::min(top, result.ranked.size());
  int width = 6;  // "layout"
  for (std::size_t i = 0; i < shown; ++i) {
    width = std::max(width, static_cast<int>(result.ranked[i].layout.describe().size()));
  }
  char line[480];
  std::snprintf(line, sizeof(line), "  #  %-*s  memory GiB  (state + activations)  step s  bubble   MFU\n", width,
                "layout");
  out << line;
  for (std::size_t i = 0; i < shown; ++i) {
    const Candidate& c = result.ranked[i];
    std::snprintf(line, sizeof(line), "%3zu  %-*s %11s  (%6s + %6s)      %7.3f  %5.1f%%  %4.1f%%\n", i + 1, width,
                  c.layout.describe().c_str(), gib(c.memory.device_total()).c_str(),
                  gib(c.memory.state.params + c.memory.state.grads + c.memory.state.optimizer).c_str(),
                  gib(c.memory.activations).c_str(), c.time.total, 100 * c.time.bubble, 100 * c.time.mfu);
    out << line;
  }
  if (!result.rejected.empty()) {
    out << "rejected (no layout of the family runs and fits):\n";
    for (const std::string& line : result.rejected) out << "  " << line << "\n";
  }
  return out.str();
}

std::string format_json(const PlanResult& result, std::size_t top) {
  std::ostringstream out;
  out << "{\"scored\": " << result.scored << ", \"fit\": " << result.ranked.size() << ", \"seconds\": " << result.seconds
      << ", \"candidates\": [";
  for (std::size_t i = 0; i < result.ranked.size() && i < top; ++i) {
    out << (i ? ", " : "") << candidate_json(result.ranked[i], std::nullopt);
  }
  out << "], \"rejected\": [";
  for (std::size_t i = 0; i < result.rejected.size(); ++i) out << (i ? ", " : "") << json_string(result.rejected[i]);
  out << "]}";
  return out.str();
}

std::string format_candidate_json(const Candidate& candidate, std::size_t rank) {
  return candidate_json(candidate, rank);
}

}  // namespace parallax::planner
