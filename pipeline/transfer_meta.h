// The shapes a pipeline transfer announces before its tensors (proto/pipeline.proto's
// TransferMeta; the protocol is in transport.h), and the checks a receiver makes on
// them. The bytes come from another process: a peer of another build, a corrupted
// message or a bug there must end in a CommError that names the transfer, not in an
// allocation of a negative or absurd size. Internal to parallax_pipeline (installed
// only because transport.h keeps decoded shapes); pure, without LibTorch's tensors, so
// tests/fuzz/ fuzzes it alone.
//
//   detail::check_meta_length(header, origin);
//   for (const detail::WireTensor& t : detail::decode_transfer_meta(bytes, origin)) ...
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace parallax::pipeline::detail {

/// One tensor of a transfer, as its receiver allocates it.
struct WireTensor {
  /// False for a gradient the sender has none for: no payload follows.
  bool defined = true;
  std::vector<std::int64_t> shape;  ///< sizes, e.g. {4, 128, 768}
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool requires_grad = false;  ///< activations: the receiver's copy is a leaf that requires grad
};

/// Longest serialized TransferMeta a receiver accepts, in bytes (4096 tensors of 8
/// dimensions take about 300 KB).
constexpr std::int64_t kMaxMetaBytes = std::int64_t{1} << 20;
/// Most tensors one transfer may carry.
constexpr int kMaxTensors = 4096;
/// Most dimensions one tensor may have.
constexpr int kMaxDims = 64;

/// Checks a transfer's header, the announced length of its TransferMeta in bytes
/// (0: the stream's previous shapes again). Throws CommError naming `origin` (e.g.
/// "pipeline transfer from stage 1 on group 'pp[tp=0,dp=0]'") unless
/// 0 <= length <= kMaxMetaBytes.
void check_meta_length(std::int64_t length, const std::string& origin);

/// Decodes a serialized TransferMeta. Throws CommError naming `origin` when the bytes
/// do not parse, announce no tensor or more than kMaxTensors, or a defined tensor with
/// a dtype the transport does not carry (float32/64, bfloat16, float16, int8, uint8,
/// int32, int64, bool), more than kMaxDims dimensions, a negative size, or more bytes
/// than an int64 counts.
std::vector<WireTensor> decode_transfer_meta(const std::string& bytes, const std::string& origin);

}  // namespace parallax::pipeline::detail
