#include "parallax/offload/side_stream.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "parallax/core/error.h"

namespace parallax::offload {
namespace {

c10::Stream side_stream_for(c10::Device device) {
  if (device.is_cpu()) return c10::Stream(c10::Stream::DEFAULT, device);
  const c10::impl::VirtualGuardImpl guard(device.type());
  return guard.getStreamFromGlobalPool(device);
}

}  // namespace

bool HostCopy::done() const {
  return !event_ || event_->query();
}

void HostCopy::wait() const {
  // c10::Event has no host wait before LibTorch 2.x: the side stream does (every copy
  // queued on it before this one is done too, which costs nothing extra here).
  if (event_ && !event_->query()) side_.synchronize();
}

void HostCopy::order_current_stream() const {
  if (!event_) return;
  const c10::impl::VirtualGuardImpl guard(side_.device_type());
  event_->block(guard.getStream(side_.device()));
}

SideStreamCopies::SideStreamCopies(c10::Device device) : device_(device), side_(side_stream_for(device)) {}

torch::Tensor SideStreamCopies::host_buffer(std::int64_t numel, torch::ScalarType dtype) const {
  return torch::empty({numel}, torch::TensorOptions().dtype(dtype).pinned_memory(!device_.is_cpu()));
}

HostCopy SideStreamCopies::copy(const torch::Tensor& destination, const torch::Tensor& source) {
  PARALLAX_ASSERT(destination.numel() == source.numel(), "a side-stream copy of ", source.numel(), " elements into ",
                  destination.numel());
  torch::NoGradGuard no_grad;
  if (device_.is_cpu()) {
    destination.view({-1}).copy_(source.view({-1}));
    return HostCopy();
  }
  const bool to_host = destination.is_cpu();
  const torch::Tensor& on_device = to_host ? source : destination;
  PARALLAX_ASSERT(on_device.device() == device_ && (to_host || source.is_cpu()), "a side-stream copy runs between ",
                  device_, " and the host, not from ", source.device(), " to ", destination.device());
  const c10::impl::VirtualGuardImpl guard(device_.type());
  // The side stream starts after what the compute stream queued so far (the producer
  // of a device source, or the last reader of a device destination).
  c10::Event queued(device_.type());
  queued.record(guard.getStream(device_));
  queued.block(side_);
  {
    const c10::StreamGuard on_side(side_);
    destination.view({-1}).copy_(source.view({-1}), /*non_blocking=*/true);
  }
  guard.recordDataPtrOnStream(on_device.storage().data_ptr(), side_);
  auto finished = std::make_shared<c10::Event>(device_.type());
  finished->record(side_);
  return HostCopy(std::move(finished), side_);
}

void SideStreamCopies::wait_all() const {
  if (!device_.is_cpu()) side_.synchronize();
}

}  // namespace parallax::offload
