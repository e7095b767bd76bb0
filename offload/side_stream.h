// Copies between a device and host memory on a side stream of the device, ordered
// against the compute stream with events (as c10d orders its collectives), so the copy
// overlaps whatever the compute stream runs next and only the code that needs the
// result waits: the host (wait) or the compute stream (order_current_stream).
//
// Built on c10's device-generic streams and events, so it compiles and runs the same
// against any LibTorch; on a CPU device every copy runs at once, in the caller's order,
// and every wait returns at once. A host tensor must be page-locked (pinned) for its
// copy to be asynchronous; an ordinary one is copied synchronously by LibTorch, which
// is correct but overlaps nothing.
//
//   SideStreamCopies copies(device);
//   HostCopy copy = copies.copy(pinned_host_shard, device_gradient);  // returns at once
//   ... backward goes on ...
//   copy.wait();                                      // before the host reads the shard
//   copies.copy(device_shard, pinned_update).order_current_stream();  // before a kernel reads it
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <torch/types.h>

#include <memory>

namespace c10 {
struct Event;
}

namespace parallax::offload {

/// One copy started by SideStreamCopies: done once its event has passed.
class HostCopy {
 public:
  HostCopy() = default;  ///< done
  /// True once the copy has finished (always on a CPU device).
  bool done() const;
  /// Blocks the calling thread until the copy has finished.
  void wait() const;
  /// Work queued on the device's current stream after this call runs after the copy.
  void order_current_stream() const;

 private:
  friend class SideStreamCopies;
  HostCopy(std::shared_ptr<c10::Event> event, c10::Stream side) : event_(std::move(event)), side_(side) {}
  std::shared_ptr<c10::Event> event_;  ///< null: done
  c10::Stream side_{c10::Stream::DEFAULT, c10::Device(c10::kCPU)};
};

class SideStreamCopies {
 public:
  /// `device`: the compute device. A CUDA (or other accelerator) device gets a stream
  /// from LibTorch's pool; a CPU device none.
  explicit SideStreamCopies(c10::Device device);

  c10::Device device() const { return device_; }
  /// A host tensor of `numel` elements of `dtype`, pinned when the device is not the CPU.
  torch::Tensor host_buffer(std::int64_t numel, torch::ScalarType dtype) const;

  /// Copies `source` into `destination` (same element count; one on the device, the
  /// other on the host) on the side stream, after the work the current stream has
  /// queued so far. Returns at once. The device tensor's memory is not reused by
  /// LibTorch's caching allocator before the copy has read or written it; the caller
  /// keeps the host tensor alive until the copy is done (or lets LibTorch's pinned-memory
  /// cache, which records the copy, hold it).
  HostCopy copy(const torch::Tensor& destination, const torch::Tensor& source);
  /// Blocks until every copy started so far has finished.
  void wait_all() const;

 private:
  c10::Device device_;
  c10::Stream side_;
};

}  // namespace parallax::offload
