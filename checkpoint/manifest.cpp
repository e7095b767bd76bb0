#include "parallax/checkpoint/manifest.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <unordered_set>
#include <vector>

#include "parallax/core/error.h"
#include "parallax/core/tensor_cut.h"
#include "proto/checkpoint.pb.h"

namespace parallax::checkpoint {
namespace {

constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 62;

// a · b, or nothing when it exceeds `limit`.
std::optional<std::uint64_t> bounded_product(std::uint64_t a, std::uint64_t b, std::uint64_t limit) {
  if (a != 0 && b > limit / a) return std::nullopt;
  return a * b;
}

// The number of elements of `shape`, or nothing when a dimension is negative or the
// product reaches 2^62.
std::optional<std::uint64_t> elements_of(const google::protobuf::RepeatedField<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    std::optional<std::uint64_t> product;
    if (d >= 0) product = bounded_product(n, static_cast<std::uint64_t>(d), kMaxElements);
    if (!product) return std::nullopt;
    n = *product;
  }
  return n;
}

// A tensor saved as a part: its cut fits its whole shape and gives its own shape.
void check_part(const proto::CheckpointTensor& tensor, const std::string& path) {
  const proto::TensorPart& part = tensor.part();
  const std::string what = "tensor '" + tensor.name() + "', part " + std::to_string(part.index()) + " of " +
                           std::to_string(part.count()) + " of '" + part.whole() + "'";
  PARALLAX_CHECK(
      !part.whole().empty() && part.whole() != tensor.name() && part.index() >= 0 && part.index() < part.count(),
      CheckpointError, path, ": ", what, ": expected a whole of another name and an index below the count");
  PARALLAX_CHECK(elements_of(part.whole_shape()).has_value(), CheckpointError, path, ": ", what,
                 ": its whole shape has a negative dimension or exceeds 2^62 elements");
  const std::vector<std::int64_t> whole(part.whole_shape().begin(), part.whole_shape().end());
  std::vector<std::int64_t> expected;
  try {
    expected = part_shape(whole, TensorCut{part.dim(), part.blocks()}, part.count());
  } catch (const UsageError& e) {
    throw CheckpointError(detail::concat(path, ": ", what, ": ", e.detail()));
  }
  PARALLAX_CHECK(std::equal(expected.begin(), expected.end(), tensor.shape().begin(), tensor.shape().end()),
                 CheckpointError, path, ": ", what, ": its shape is not the cut of its whole along dimension ",
                 part.dim(), " in ", part.blocks(), " block(s)");
}

// Every tensor saved as parts: all its parts there, once each, cut alike, of one dtype.
void check_parts(const proto::CheckpointManifest& manifest, const std::string& path) {
  struct Whole {
    int first = 0;  ///< the tensor index of the first part seen
    std::set<std::int64_t> indexes;
  };
  std::map<std::string, Whole> wholes;
  for (int t = 0; t < manifest.tensors_size(); ++t) {
    const proto::CheckpointTensor& tensor = manifest.tensors(t);
    if (tensor.part().count() == 0) continue;
    PARALLAX_CHECK(tensor.part().count() > 0, CheckpointError, path, ": tensor '", tensor.name(), "' has part count ",
                   tensor.part().count());
    check_part(tensor, path);
    auto [it, added] = wholes.try_emplace(tensor.part().whole(), Whole{t, {}});
    const proto::CheckpointTensor& first = manifest.tensors(it->second.first);
    proto::TensorPart same = tensor.part();
    same.set_index(first.part().index());
    PARALLAX_CHECK(same.SerializeAsString() == first.part().SerializeAsString() && first.dtype() == tensor.dtype(),
                   CheckpointError, path, ": tensors '", first.name(), "' and '", tensor.name(), "' are parts of '",
                   tensor.part().whole(), "' cut differently or of different dtypes");
    PARALLAX_CHECK(it->second.indexes.insert(tensor.part().index()).second, CheckpointError, path, ": part ",
                   tensor.part().index(), " of '", tensor.part().whole(), "' is saved twice");
  }
  for (const auto& [name, whole] : wholes) {
    const std::int64_t count = manifest.tensors(whole.first).part().count();
    PARALLAX_CHECK(static_cast<std::int64_t>(whole.indexes.size()) == count, CheckpointError, path, ": '", name,
                   "' is saved as ", count, " parts, of which ", whole.indexes.size(), " are there");
  }
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
    const std::optional<std::uint64_t> n = elements_of(tensor.shape());
    PARALLAX_CHECK(n.has_value(), CheckpointError, path, ": tensor '", tensor.name(),
                   "' has a negative dimension or exceeds 2^62 elements");
    numel[static_cast<std::size_t>(t)] = *n;
    element[static_cast<std::size_t>(t)] = *bytes;
  }
  check_parts(manifest, path);
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
