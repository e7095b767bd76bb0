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
// past it, with a MemoryLimitError naming the limit, the request and what is live: a
// CPU stand-in for a device's memory, so a test can show what fits one rank.
//
//   CpuMemoryMeter meter(CpuMemoryMeter::Options().limit_bytes(64 << 20));
//   engine.backward(engine.cross_entropy(engine.forward(x), y));  // may throw MemoryLimitError
//   std::printf("peak %lld bytes\n", static_cast<long long>(meter.peak_bytes()));
//
// One meter at a time in a process (a second one throws UsageError); open and close it
// on a thread while no other thread is allocating (the allocator is swapped under it).
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <memory>

#include "parallax/core/error.h"

namespace parallax {

/// An allocation refused because it would pass a per-rank memory limit (CpuMemoryMeter).
class MemoryLimitError : public Error {
 public:
  explicit MemoryLimitError(const std::string& detail) : Error("MemoryLimitError", detail) {}
};

class CpuMemoryMeter final {
 public:
  struct Options {
    /// Refuse an allocation that would take live bytes past this. Default: 0 (no limit).
    Options& limit_bytes(std::int64_t bytes) {
      limit_bytes_ = bytes;
      return *this;
    }
    std::int64_t limit_bytes_ = 0;
  };

  /// Installs the meter as LibTorch's CPU allocator, wrapping the one installed now.
  /// Throws UsageError when another meter is open, or a limit is negative.
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
