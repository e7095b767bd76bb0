#include "parallax/core/cpu_memory_meter.h"

#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "parallax/core/error.h"

namespace parallax {

namespace {
// Above LibTorch's default (0), so SetCPUAllocator takes the meter, and restoring the
// wrapped allocator with the same priority takes it back.
constexpr std::uint8_t kPriority = 100;
thread_local const char* current_phase = "outside the engine";

std::string readable(std::int64_t bytes) {
  if (bytes < (1 << 20)) return std::to_string(bytes) + " bytes";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}
}  // namespace

// The counts live here, shared with every block handed out, so a block freed after the
// meter closed still finds them.
class CpuMemoryMeter::Counting final : public c10::Allocator, public std::enable_shared_from_this<Counting> {
 public:
  Counting(c10::Allocator* inner, std::int64_t limit, std::string source)
      : inner_(inner), inner_meter_(dynamic_cast<const Counting*>(inner)), limit_(limit), source_(std::move(source)) {}

#if TORCH_VERSION_MAJOR >= 2
  c10::DataPtr allocate(std::size_t bytes) override {
#else
  c10::DataPtr allocate(std::size_t bytes) const override {
#endif
    void* data = allocate_block(bytes, static_cast<std::int64_t>(bytes));
    return {data, data, &free_block, c10::Device(c10::DeviceType::CPU)};
  }

  // A block of `bytes` (and our header) whose `counted` bytes count here and in every
  // meter this one wraps (which see the tensor's bytes, not our headers).
  void* allocate_block(std::size_t bytes, std::int64_t counted) const {
    const std::int64_t size = counted;
    const std::int64_t live = live_.fetch_add(size) + size;
    if (limit_ > 0 && live > limit_) {
      live_ -= size;
      PARALLAX_CHECK(false, MemoryLimitError, "allocating ", readable(size), " during ", current_phase, ", with ",
                     readable(live - size), " live, passes the limit of ", readable(limit_), " (", source_, ")");
    }
    std::int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    // The block's size and counts sit in a header in front of it, so the DataPtr stays
    // simple (its context is its data): LibTorch's kernels raw_allocate from the CPU
    // allocator, which needs that.
    char* raw = nullptr;
    try {
      raw = static_cast<char*>(inner_meter_ != nullptr ? inner_meter_->allocate_block(bytes + kHeaderBytes, counted)
                                                       : inner_->raw_allocate(bytes + kHeaderBytes));
    } catch (...) {
      live_ -= size;
      throw;
    }
    new (raw) Header{size, shared_from_this(), inner_->raw_deleter()};
    return raw + kHeaderBytes;
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
#if TORCH_VERSION_MAJOR >= 2
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  c10::Allocator* inner() const { return inner_; }
  std::int64_t live() const { return live_; }
  std::int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = live_.load(); }

 private:
  struct Header {
    std::int64_t bytes;
    std::shared_ptr<const Counting> counts;
    c10::DeleterFnPtr inner_free;
  };
  // A multiple of LibTorch's 64-byte alignment, so the data keeps it.
  static constexpr std::size_t kHeaderBytes = 64;
  static_assert(sizeof(Header) <= kHeaderBytes);

  static void free_block(void* data) {
    char* raw = static_cast<char*>(data) - kHeaderBytes;
    auto* header = reinterpret_cast<Header*>(raw);
    header->counts->live_ -= header->bytes;
    const c10::DeleterFnPtr inner_free = header->inner_free;
    header->~Header();
    inner_free(raw);
  }

  c10::Allocator* inner_;
  const Counting* inner_meter_;  ///< inner_, when it is another meter
  std::int64_t limit_;
  std::string source_;
  mutable std::atomic<std::int64_t> live_{0};
  mutable std::atomic<std::int64_t> peak_{0};
};

CpuMemoryMeter::CpuMemoryMeter(const Options& options) {
  PARALLAX_CHECK(options.limit_bytes_ >= 0, UsageError, "CpuMemoryMeter: limit_bytes = ", options.limit_bytes_,
                 " must be >= 0 (0: no limit)");
  counting_ = std::make_shared<Counting>(c10::GetCPUAllocator(), options.limit_bytes_, options.source_);
  c10::SetCPUAllocator(counting_.get(), kPriority);
}

CpuMemoryMeter::~CpuMemoryMeter() {
  if (c10::GetCPUAllocator() == counting_.get()) {
    c10::SetCPUAllocator(counting_->inner(), kPriority);
    return;
  }
  // Closed before a meter opened after it, which allocates through this one: this one
  // stays (counting, its limit kept) for the rest of the process.
  static std::vector<std::shared_ptr<Counting>> still_wrapped;
  still_wrapped.push_back(counting_);
}

MemoryPhase::MemoryPhase(const char* what) : previous_(current_phase) {
  current_phase = what;
}

MemoryPhase::MemoryPhase(MemoryPhase&& other) noexcept
    : previous_(other.previous_), active_(std::exchange(other.active_, false)) {}

MemoryPhase::~MemoryPhase() {
  if (active_) current_phase = previous_;
}

std::int64_t CpuMemoryMeter::live_bytes() const {
  return counting_->live();
}

std::int64_t CpuMemoryMeter::peak_bytes() const {
  return counting_->peak();
}

void CpuMemoryMeter::reset_peak() {
  counting_->reset_peak();
}

}  // namespace parallax
