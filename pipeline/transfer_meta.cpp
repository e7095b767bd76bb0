#include "parallax/pipeline/transfer_meta.h"

#include <limits>

#include "parallax/core/error.h"
#include "proto/pipeline.pb.h"

namespace parallax::pipeline::detail {
namespace {

bool carried(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Half:
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Bool:
      return true;
    default:
      return false;
  }
}

}  // namespace

void check_meta_length(std::int64_t length, const std::string& origin) {
  PARALLAX_CHECK(length >= 0 && length <= kMaxMetaBytes, CommError, origin, " announces shapes of ", length,
                 " bytes; expected 0 (unchanged) to ", kMaxMetaBytes, " (a corrupted message, or a peer of another build)");
}

std::vector<WireTensor> decode_transfer_meta(const std::string& bytes, const std::string& origin) {
  proto::TransferMeta meta;
  PARALLAX_CHECK(meta.ParseFromString(bytes), CommError, origin, ": its TransferMeta (", bytes.size(),
                 " bytes) does not parse");
  PARALLAX_CHECK(meta.tensors_size() > 0 && meta.tensors_size() <= kMaxTensors, CommError, origin, " announces ",
                 meta.tensors_size(), " tensors; expected 1 to ", kMaxTensors);
  std::vector<WireTensor> tensors;
  tensors.reserve(static_cast<std::size_t>(meta.tensors_size()));
  for (int i = 0; i < meta.tensors_size(); ++i) {
    const proto::TensorMeta& m = meta.tensors(i);
    WireTensor tensor;
    tensor.defined = m.defined();
    if (tensor.defined) {
      const auto dtype = static_cast<c10::ScalarType>(m.dtype());
      PARALLAX_CHECK(m.dtype() >= 0 && m.dtype() < static_cast<int>(c10::ScalarType::NumOptions) && carried(dtype),
                     CommError, origin, ": tensor ", i, " has dtype code ", m.dtype(),
                     ", which the transport does not carry (float32/64, bfloat16, float16, int8, uint8, int32, "
                     "int64, bool)");
      PARALLAX_CHECK(m.shape_size() <= kMaxDims, CommError, origin, ": tensor ", i, " has ", m.shape_size(),
                     " dimensions; at most ", kMaxDims);
      // Bytes, counted without overflow: each size must leave the product under int64's max.
      std::int64_t count = static_cast<std::int64_t>(c10::elementSize(dtype));
      for (const std::int64_t size : m.shape()) {
        PARALLAX_CHECK(size >= 0, CommError, origin, ": tensor ", i, " has the negative size ", size);
        PARALLAX_CHECK(size == 0 || count <= std::numeric_limits<std::int64_t>::max() / size, CommError, origin,
                       ": tensor ", i, "'s shape has more bytes than an int64 counts");
        count *= size;
      }
      tensor.shape.assign(m.shape().begin(), m.shape().end());
      tensor.dtype = dtype;
      tensor.requires_grad = m.requires_grad();
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

}  // namespace parallax::pipeline::detail
