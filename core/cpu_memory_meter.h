// The bytes LibTorch's CPU allocator holds, counted exactly, with an optional limit that
// refuses an allocation the way a device refuses one past its memory.
//
// While a meter is alive it is LibTorch's CPU allocator: every block any thread
// allocates through it (forward, backward, the optimizer, communication buffers) adds
// its size to live_bytes() and subtracts it when freed, whenever that is (the count
// outlives the meter for the blocks it handed out). Blocks allocated before the meter
// opened are not counted. peak_bytes() is the highest live_bytes() since the meter
// opened or since reset_peak(). What it counts is tensor storage: not the allocator's
// own overhead, not memory outside LibTorch (MPI's buffers, the program's own).
//
// A limit makes it refuse, before allocating, any block that would take live_bytes()
// past it, with a MemoryLimitError naming the limit and its source, the request, the
// phase (MemoryPhase) and what is live: a CPU stand-in for a device's memory, so a test
// can show what fits one rank (memory.limit_mb sets the runtime's).
//
//   CpuMemoryMeter meter(CpuMemoryMeter::Options().limit_bytes(64 << 20));
//   engine.backward(engine.cross_entropy(engine.forward(x), y));  // may throw MemoryLimitError
//   std::printf("peak %lld bytes\n", static_cast<long long>(meter.peak_bytes()));
//
// Meters nest: one opened while another is open wraps it, and a block counts in every
// meter open when it was allocated (the runtime keeps one open for its per-step peaks,
// runtime.h; a test may open its own around a phase). Close them in the reverse order
// of opening, as scopes do (one closed out of order stays installed, counting, until the
// process ends). Open and close a meter on a thread while no other thread is allocating
// (the allocator is swapped under it).
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "parallax/core/error.h"

namespace parallax {

/// An allocation refused because it would pass a per-rank memory limit (CpuMemoryMeter).
class MemoryLimitError : public Error {
 public:
  explicit MemoryLimitError(const std::string& detail) : Error("MemoryLimitError", detail) {}
};

/// Names what the current thread is doing, for a MemoryLimitError's message, while it
/// lives ("the forward", "the optimizer step", "a checkpoint load"); scopes nest, the
/// innermost names it. A thread without one is "outside the engine".
class MemoryPhase {
 public:
  explicit MemoryPhase(const char* what);
  /// The moved-from scope restores nothing; this one restores what it did.
  MemoryPhase(MemoryPhase&& other) noexcept;
  ~MemoryPhase();
  MemoryPhase(const MemoryPhase&) = delete;
  MemoryPhase& operator=(const MemoryPhase&) = delete;
  MemoryPhase& operator=(MemoryPhase&&) = delete;

 private:
  const char* previous_;
  bool active_ = true;
};

class CpuMemoryMeter final {
 public:
  struct Options {
    /// Refuse an allocation that would take live bytes past this. Default: 0 (no limit).
    Options& limit_bytes(std::int64_t bytes) {
      limit_bytes_ = bytes;
      return *this;
    }
    /// Where the limit comes from and whose it is, for the error:
    /// "memory.limit_mb = 512, rank 3 of 8". Default: "this rank's memory limit".
    Options& source(std::string text) {
      source_ = std::move(text);
      return *this;
    }
    std::int64_t limit_bytes_ = 0;
    std::string source_ = "this rank's memory limit";
  };

  /// Installs the meter as LibTorch's CPU allocator, wrapping the one installed now (which
  /// may be another meter). Throws UsageError for a negative limit.
  explicit CpuMemoryMeter(const Options& options);
  /// A meter without a limit.
  CpuMemoryMeter() : CpuMemoryMeter(Options()) {}
  /// Puts the wrapped allocator back.
  ~CpuMemoryMeter();
  CpuMemoryMeter(const CpuMemoryMeter&) = delete;
  CpuMemoryMeter& operator=(const CpuMemoryMeter&) = delete;

  /// Bytes of the blocks this meter handed out that are not yet freed.
  std::int64_t live_bytes() const;
  /// The highest live_bytes() since the meter opened or since reset_peak().
  std::int64_t peak_bytes() const;
  /// Makes the peak the bytes live now.
  void reset_peak();

 private:
  class Counting;
  std::shared_ptr<Counting> counting_;
};

}  // namespace parallax
