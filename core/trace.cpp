#include "parallax/core/trace.h"

#include <fstream>
#include <functional>
#include <sstream>

#include "parallax/core/error.h"

namespace parallax {

Tracer::Tracer(bool enabled) : enabled_(enabled), origin_(std::chrono::steady_clock::now()) {}

Tracer::Span::Span(Tracer* tracer, const char* name, const char* category)
    : tracer_(tracer), name_(name), category_(category), start_us_(tracer ? tracer->now_us() : 0) {}

Tracer::Span::Span(Span&& other) noexcept
    : tracer_(other.tracer_), name_(other.name_), category_(other.category_), start_us_(other.start_us_) {
  other.tracer_ = nullptr;
}

Tracer::Span::~Span() {
  if (tracer_ != nullptr) tracer_->record(name_, category_, start_us_, tracer_->now_us() - start_us_);
}

std::int64_t Tracer::now_us() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - origin_).count();
}

void Tracer::record(const char* name,
                    const char* category,
                    std::int64_t start_us,
                    std::int64_t duration_us,
                    int micro_batch,
                    int chunk) {
  if (!enabled_) return;
  const auto thread = static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000);
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({name, category, start_us, duration_us, thread, micro_batch, chunk});
}

void Tracer::align_origin() {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  const auto shift = std::chrono::duration_cast<std::chrono::microseconds>(now - origin_).count();
  for (Event& e : events_) e.start_us -= shift;
  origin_ = now;
}

std::size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::string Tracer::events_json(int pid) const {
  std::ostringstream out;
  std::lock_guard<std::mutex> lock(mutex_);
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid << ",\"args\":{\"name\":\"rank " << pid << "\"}}";
  for (const Event& e : events_) {
    out << ",\n{\"name\":\"" << e.name << "\",\"cat\":\"" << e.category << "\",\"ph\":\"X\",\"ts\":" << e.start_us
        << ",\"dur\":" << e.duration_us << ",\"pid\":" << pid << ",\"tid\":" << e.thread;
    if (e.micro_batch >= 0) out << ",\"args\":{\"micro_batch\":" << e.micro_batch << ",\"chunk\":" << e.chunk << "}";
    out << "}";
  }
  return out.str();
}

void Tracer::write(const std::string& path, int pid) const {
  write_merged(path, {events_json(pid)});
}

void Tracer::write_merged(const std::string& path, const std::vector<std::string>& parts) {
  std::ofstream out(path);
  PARALLAX_CHECK(out.good(), UsageError, "cannot write trace file '", path, "'");
  out << "{\"traceEvents\":[\n";
  for (std::size_t i = 0; i < parts.size(); ++i) out << (i ? ",\n" : "") << parts[i];
  out << "\n]}\n";
  PARALLAX_CHECK(out.good(), UsageError, "failed writing trace file '", path, "'");
}

std::string Tracer::per_rank_path(const std::string& path, int rank) {
  const std::string tag = ".rank" + std::to_string(rank);
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

}  // namespace parallax
