#include "parallax/pipeline/transport.h"

#include <cstring>

#include "parallax/core/error.h"
#include "parallax/pipeline/transfer_meta.h"
#include "proto/pipeline.pb.h"

namespace parallax::pipeline {
namespace {

std::string describe_meta(const Activation& value) {
  proto::TransferMeta meta;
  for (const torch::Tensor& t : value) {
    proto::TensorMeta* m = meta.add_tensors();
    m->set_defined(t.defined());
    if (!t.defined()) continue;
    for (std::int64_t size : t.sizes()) m->add_shape(size);
    m->set_dtype(static_cast<std::int32_t>(t.scalar_type()));
    m->set_requires_grad(t.requires_grad());
  }
  return meta.SerializeAsString();
}

// MPI has no bool type: a bool tensor travels as its bytes.
torch::Tensor wire_view(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBool ? t.view(torch::kUInt8) : t;
}

}  // namespace

Transport::Transport(Communicator& comm) : comm_(comm) {}

Transport::~Transport() {
  // Sends still in flight read tensors held here: let them finish (or fail) first.
  for (auto& [work, tensors] : pending_) {
    try {
      work->wait();
    } catch (...) {
    }
  }
}

void Transport::send(const Activation& value, int peer, Stream stream) {
  const int tag = static_cast<int>(stream);
  std::string meta = describe_meta(value);
  std::string& last = sent_meta_[{peer, stream}];
  const bool changed = meta != last;
  torch::Tensor header = torch::full({1}, changed ? static_cast<std::int64_t>(meta.size()) : 0, torch::kInt64);
  std::vector<torch::Tensor> keep{header};
  pending_.push_back({comm_.send(header, peer, tag), keep});
  if (changed) {
    torch::Tensor bytes = torch::empty({static_cast<std::int64_t>(meta.size())}, torch::kUInt8);
    std::memcpy(bytes.data_ptr(), meta.data(), meta.size());
    pending_.push_back({comm_.send(bytes, peer, tag), {bytes}});
    last = std::move(meta);
    ++meta_sent_;
  }
  for (const torch::Tensor& t : value) {
    if (!t.defined()) continue;
    torch::Tensor payload = wire_view(t.detach().contiguous());
    pending_.push_back({comm_.send(payload, peer, tag), {payload}});
  }
}

Activation Transport::recv(int peer, Stream stream) {
  const int tag = static_cast<int>(stream);
  const std::string origin = ::parallax::detail::concat("pipeline transfer from stage ", peer, " on group '", comm_.name(), "'");
  torch::Tensor header = torch::empty({1}, torch::kInt64);
  comm_.recv(header, peer, tag)->wait();
  const std::int64_t length = header.item<std::int64_t>();
  detail::check_meta_length(length, origin);
  std::vector<detail::WireTensor>& shapes = received_meta_[{peer, stream}];
  if (length > 0) {
    torch::Tensor bytes = torch::empty({length}, torch::kUInt8);
    comm_.recv(bytes, peer, tag)->wait();
    shapes = detail::decode_transfer_meta(
        std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(length)), origin);
  }
  PARALLAX_CHECK(!shapes.empty(), CommError, origin, " announced no shapes before its first payload");
  Activation value;
  for (const detail::WireTensor& m : shapes) {
    if (!m.defined) {
      value.emplace_back();
      continue;
    }
    torch::Tensor t = torch::empty(m.shape, torch::TensorOptions().dtype(m.dtype));
    torch::Tensor wire = wire_view(t);
    comm_.recv(wire, peer, tag)->wait();
    if (m.requires_grad && t.is_floating_point()) t.requires_grad_(true);
    value.push_back(t);
  }
  return value;
}

void Transport::wait_sends() {
  std::vector<std::pair<WorkPtr, std::vector<torch::Tensor>>> pending;
  pending.swap(pending_);
  for (auto& [work, tensors] : pending) work->wait();
}

}  // namespace parallax::pipeline
