#include "parallax/checkpoint/manifest.h"

#include <limits>
#include <unordered_set>

#include "parallax/core/error.h"
#include "proto/checkpoint.pb.h"

namespace parallax::checkpoint {
namespace {

constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 62;

// a · b, or nothing when it exceeds `limit`.
std::optional<std::uint64_t> bounded_product(std::uint64_t a, std::uint64_t b, std::uint64_t limit) {
  if (a != 0 && b > limit / a) return std::nullopt;
  return a * b;
}

}  // namespace

std::optional<std::uint64_t> element_bytes(const std::string& dtype) {
  if (dtype == "Double" || dtype == "Long") return 8;
  if (dtype == "Float" || dtype == "Int") return 4;
  if (dtype == "BFloat16" || dtype == "Half" || dtype == "Short") return 2;
  if (dtype == "Byte" || dtype == "Char" || dtype == "Bool") return 1;
  return std::nullopt;
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::unique_ptr<proto::CheckpointManifest> parse_manifest(const std::string& text, const std::string& path) {
  auto manifest = std::make_unique<proto::CheckpointManifest>();
  PARALLAX_CHECK(manifest->ParseFromString(text), CheckpointError, path, ": does not parse");
  PARALLAX_CHECK(manifest->format_version() == kManifestFormatVersion, CheckpointError, path, ": format version ",
                 manifest->format_version(), ", this build reads ", kManifestFormatVersion);
  check_manifest(*manifest, path);
  return manifest;
}

void check_manifest(const proto::CheckpointManifest& manifest, const std::string& path, bool with_crcs) {
  const std::uint64_t block_bytes = manifest.block_bytes();
  PARALLAX_CHECK(!with_crcs || block_bytes > 0, CheckpointError, path, ": block_bytes is 0");
  std::unordered_set<std::string> files;
  for (const proto::CheckpointFile& file : manifest.files()) {
    PARALLAX_CHECK(is_plain_file_name(file.name()), CheckpointError, path, ": file name '", file.name(),
                   "' is not a plain name inside the checkpoint directory");
    PARALLAX_CHECK(files.insert(file.name()).second, CheckpointError, path, ": file '", file.name(),
                   "' is listed twice");
  }
  std::unordered_set<std::string> names;
  std::vector<std::uint64_t> numel(static_cast<std::size_t>(manifest.tensors_size()));
  std::vector<std::uint64_t> element(numel.size());
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    const proto::CheckpointTensor& tensor = manifest.tensors(t);
    PARALLAX_CHECK(!tensor.name().empty() && names.insert(tensor.name()).second, CheckpointError, path, ": tensor ", t,
                   " has an empty or repeated name '", tensor.name(), "'");
    const std::optional<std::uint64_t> bytes = element_bytes(tensor.dtype());
    PARALLAX_CHECK(bytes.has_value(), CheckpointError, path, ": tensor '", tensor.name(), "' has dtype '",
                   tensor.dtype(), "', which this build does not read");
    std::uint64_t n = 1;
    for (std::int64_t d : tensor.shape()) {
      std::optional<std::uint64_t> product;
      if (d >= 0) product = bounded_product(n, static_cast<std::uint64_t>(d), kMaxElements);
      PARALLAX_CHECK(product.has_value(), CheckpointError, path, ": tensor '", tensor.name(), "' has dimension ", d,
                     " (negative, or the tensor exceeds 2^62 elements)");
      n = *product;
    }
    numel[static_cast<std::size_t>(t)] = n;
    element[static_cast<std::size_t>(t)] = *bytes;
  }
  for (int p = 0; p < manifest.pieces_size(); ++p) {
    const proto::CheckpointPiece& piece = manifest.pieces(p);
    PARALLAX_CHECK(piece.tensor() < numel.size(), CheckpointError, path, ": piece ", p, " names tensor ",
                   piece.tensor(), " of ", numel.size());
    PARALLAX_CHECK(piece.file() < static_cast<std::uint32_t>(manifest.files_size()), CheckpointError, path, ": piece ",
                   p, " names file ", piece.file(), " of ", manifest.files_size());
    const std::string& name = manifest.tensors(static_cast<int>(piece.tensor())).name();
    const std::uint64_t whole = numel[piece.tensor()];
    const bool inside = piece.offset() >= 0 && piece.numel() >= 0 &&
                        static_cast<std::uint64_t>(piece.offset()) <= whole &&
                        static_cast<std::uint64_t>(piece.numel()) <= whole - static_cast<std::uint64_t>(piece.offset());
    PARALLAX_CHECK(inside, CheckpointError, path, ": piece ", p, " holds elements [", piece.offset(), ", +",
                   piece.numel(), ") of tensor '", name, "', which has ", whole);
    const std::uint64_t bytes = static_cast<std::uint64_t>(piece.numel()) * element[piece.tensor()];
    const proto::CheckpointFile& file = manifest.files(static_cast<int>(piece.file()));
    PARALLAX_CHECK(piece.byte_offset() <= file.bytes() && bytes <= file.bytes() - piece.byte_offset(), CheckpointError,
                   path, ": piece ", p, " of tensor '", name, "' (bytes ", piece.byte_offset(), " + ", bytes,
                   ") ends past file '", file.name(), "' (", file.bytes(), " bytes)");
    if (with_crcs) {
      const std::uint64_t blocks = bytes / block_bytes + (bytes % block_bytes != 0 ? 1 : 0);
      PARALLAX_CHECK(static_cast<std::uint64_t>(piece.block_crc32_size()) == blocks, CheckpointError, path, ": piece ",
                     p, " of tensor '", name, "' has ", piece.block_crc32_size(), " block CRCs, its ", bytes,
                     " bytes need ", blocks);
    }
  }
}

}  // namespace parallax::checkpoint
