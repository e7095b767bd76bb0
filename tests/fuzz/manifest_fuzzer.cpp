// libFuzzer harness: a checkpoint's manifest.pb is untrusted input (a checkpoint may come
// from anywhere, or be corrupted on disk). parse_manifest must return a manifest whose
// every index and range the reader relies on is inside what it describes, or throw
// CheckpointError: never crash, hang, leak or throw anything else. After a successful
// parse the harness touches what checkpoint::Reader touches (each piece's tensor, file
// and block CRCs), so a check parse_manifest forgets is an out-of-bounds read that
// AddressSanitizer reports. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "parallax/checkpoint/manifest.h"
#include "parallax/core/error.h"
#include "proto/checkpoint.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto manifest =
        parallax::checkpoint::parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "manifest.pb");
    std::uint64_t touched = 0;
    for (const auto& piece : manifest->pieces()) {
      touched += manifest->tensors(static_cast<int>(piece.tensor())).shape_size();
      touched += manifest->files(static_cast<int>(piece.file())).bytes();
      for (int b = 0; b < piece.block_crc32_size(); ++b) touched += piece.block_crc32(b);
    }
    return touched == 42 ? 0 : 0;
  } catch (const parallax::CheckpointError&) {
    return 0;
  }
}
