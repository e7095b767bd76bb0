#include "parallax/zero/gradient_presence.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace parallax::zero {
namespace {

// The union over `comm` of `flags`' entries at `indices`, written back into `flags`.
void union_over(Communicator& comm, const std::vector<std::size_t>& indices, std::vector<bool>& flags,
                c10::Device device) {
  if (comm.size() == 1 || indices.empty()) return;
  at::Tensor bytes = at::empty({static_cast<std::int64_t>(indices.size())}, at::kByte);
  auto* data = bytes.data_ptr<std::uint8_t>();
  for (std::size_t k = 0; k < indices.size(); ++k) data[k] = flags[indices[k]] ? 1 : 0;
  at::Tensor on_device = bytes.to(device);
  CollectiveOptions max;
  max.reduce_op = ReduceOp::kMax;
  comm.all_reduce(on_device, max)->wait();
  bytes = on_device.cpu();
  data = bytes.data_ptr<std::uint8_t>();
  for (std::size_t k = 0; k < indices.size(); ++k) flags[indices[k]] = data[k] != 0;
}

}  // namespace

std::vector<bool> agree_on_gradients(const std::vector<bool>& local,
                                     Communicator& dense,
                                     const OtherReductionGroup& experts,
                                     c10::Device device) {
  std::vector<bool> present = local;
  std::vector<bool> is_expert(local.size(), false);
  for (std::size_t i : experts.members) is_expert.at(i) = true;
  std::vector<std::size_t> dense_indices;
  for (std::size_t i = 0; i < local.size(); ++i) {
    if (!is_expert[i]) dense_indices.push_back(i);
  }
  union_over(dense, dense_indices, present, device);
  if (experts.comm != nullptr) union_over(*experts.comm, experts.members, present, device);
  return present;
}

}  // namespace parallax::zero
