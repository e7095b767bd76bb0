// libFuzzer harness: a pipeline stage's TransferMeta comes from another process
// (pipeline/transfer_meta.h). The input is what a receiver reads: its first 8 bytes the
// header (the announced length, int64), the rest the serialized TransferMeta.
// check_meta_length and decode_transfer_meta must accept it or throw CommError: never
// crash, hang, leak or throw anything else. What they accept must be allocatable
// arithmetic: each defined tensor's element count times its element size fits an int64
// (the harness recomputes it with overflow checks, and aborts if it does not).
// Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "parallax/core/error.h"
#include "parallax/pipeline/transfer_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace detail = parallax::pipeline::detail;
  if (size < sizeof(std::int64_t)) return 0;
  std::int64_t header = 0;
  std::memcpy(&header, data, sizeof(header));
  const std::string origin = "pipeline transfer from stage 1 on group 'pp[tp=0,dp=0]'";
  try {
    detail::check_meta_length(header, origin);
    const std::string bytes(reinterpret_cast<const char*>(data) + sizeof(header), size - sizeof(header));
    for (const detail::WireTensor& tensor : detail::decode_transfer_meta(bytes, origin)) {
      if (!tensor.defined) continue;
      std::int64_t count = static_cast<std::int64_t>(c10::elementSize(tensor.dtype));
      for (const std::int64_t dim : tensor.shape) {
        if (dim < 0 || __builtin_mul_overflow(count, dim, &count)) std::abort();
      }
    }
    return 0;
  } catch (const parallax::CommError&) {
    return 0;
  }
}
