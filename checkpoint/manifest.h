// A checkpoint's manifest read back as untrusted input: parsed, then checked so that
// every index, offset and size in it stays inside what it describes, before anything
// reads a byte of data through it. No LibTorch, no file system: the fuzzer
// (tests/fuzz/) drives this directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace parallax::proto {
class CheckpointManifest;
}

namespace parallax::checkpoint {

/// The format this build writes and reads.
constexpr std::uint32_t kManifestFormatVersion = 1;

/// Bytes per element of a saved dtype ("Float", "BFloat16", "Byte", ...: LibTorch's
/// names), or nothing for a name this build does not store.
std::optional<std::uint64_t> element_bytes(const std::string& dtype);

/// Whether `name` may name a file inside a checkpoint directory: one path component,
/// not "." or "..", no '/' or NUL (a manifest never reaches outside its directory).
bool is_plain_file_name(const std::string& name);

/// Parses `text` (the bytes of `path`, for messages) and checks it: the format version;
/// block_bytes > 0; plain, distinct file names; distinct tensor names with known dtypes
/// and non-negative shapes whose sizes fit in 63 bits; every piece's tensor and file
/// index in range, its element range inside its tensor, its bytes inside its file, and
/// one CRC-32 per block (`with_crcs`; false only for a manifest built in memory over a
/// file format that has none). Throws CheckpointError naming `path`, the entry and what
/// was expected.
std::unique_ptr<proto::CheckpointManifest> parse_manifest(const std::string& text, const std::string& path);
void check_manifest(const proto::CheckpointManifest& manifest, const std::string& path, bool with_crcs = true);

}  // namespace parallax::checkpoint
