// Per-rank spans exported as Chrome trace JSON (open in Perfetto or chrome://tracing).
//
//   Tracer tracer(enabled);
//   { auto span = tracer.span("backward", "compute"); ... }   // recorded on scope exit
//   tracer.write("trace.rank3.json", /*pid=*/3);
//
// Recording is thread-safe and costs one clock read per edge; a disabled tracer
// records nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace parallax {

class Tracer {
 public:
  explicit Tracer(bool enabled = false);

  bool enabled() const { return enabled_; }

  /// RAII span: records [construction, destruction) under `name` and `category`.
  class Span {
   public:
    Span(Tracer* tracer, const char* name, const char* category);
    Span(Span&& other) noexcept;
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    ~Span();

   private:
    Tracer* tracer_;
    const char* name_;
    const char* category_;
    std::int64_t start_us_;
  };

  /// Starts a span; `name` and `category` must outlive the tracer (string literals).
  Span span(const char* name, const char* category) { return Span(enabled_ ? this : nullptr, name, category); }

  /// Records a complete span directly. Times in microseconds since the tracer began.
  /// `micro_batch` and `chunk` (>= 0) become the span's args (pipeline instructions).
  void record(const char* name,
              const char* category,
              std::int64_t start_us,
              std::int64_t duration_us,
              int micro_batch = -1,
              int chunk = -1);

  /// Restarts the clock at now (call right after a barrier, so that every rank's times
  /// share one origin and merged traces line up). Spans recorded before shift with it.
  void align_origin();

  /// Microseconds since this tracer was created.
  std::int64_t now_us() const;

  /// Number of recorded spans.
  std::size_t size() const;

  /// Writes {"traceEvents": [...]} with `pid` (the rank). Throws UsageError naming the
  /// path if it cannot be written.
  void write(const std::string& path, int pid) const;

  /// This tracer's events as Chrome trace JSON objects separated by ",\n" (a process
  /// name record first), with `pid` (the rank): one rank's share of a merged trace.
  std::string events_json(int pid) const;

  /// Writes one trace from several ranks' events_json() parts. Throws UsageError naming
  /// the path if it cannot be written.
  static void write_merged(const std::string& path, const std::vector<std::string>& parts);

  /// "trace.json" → "trace.rank3.json": one file per rank.
  static std::string per_rank_path(const std::string& path, int rank);

 private:
  struct Event {
    const char* name;
    const char* category;
    std::int64_t start_us;
    std::int64_t duration_us;
    std::uint64_t thread;
    int micro_batch;
    int chunk;
  };

  bool enabled_;
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

}  // namespace parallax
