// How a tensor-parallel plan cuts one dense tensor into its ranks' parts, as geometry:
// along dimension `dim` the tensor is `blocks` equal blocks (a fused projection's
// [q | k | v]: 3; otherwise 1), each block is padded with zeros to a multiple of the
// part count and cut into that many equal chunks, and part r is chunk r of every block,
// concatenated. Column layers cut dim 0 (in blocks), row layers dim 1, vocabulary
// layers dim 0 with padding (a vocabulary that does not divide by tp). The plan cuts
// parameters with cut(); a checkpoint joins the saved parts of any part count back into
// the whole with join(), then cuts that for the loading run's part count.
//
//   TensorCut c{/*dim=*/0, /*blocks=*/3};
//   torch::Tensor part = cut(qkv, c, rank, tp);               // [3 * (rows/3) / tp, in]
//   torch::Tensor whole = join(parts, c, qkv.sizes().vec());  // == qkv
#pragma once

#include <cstdint>
#include <vector>

#include "parallax/core/error.h"

namespace at {
class Tensor;
}

namespace parallax {

struct TensorCut {
  std::int64_t dim = 0;
  std::int64_t blocks = 1;
};

/// The shape of each of `count` parts of a tensor of `whole` shape. Throws UsageError
/// when `dim` is not a dimension of it, blocks or count is not positive, or the blocks
/// do not divide the dimension. No LibTorch (the checkpoint manifest's checker uses it
/// on untrusted sizes, so nothing here overflows for dimensions below 2^62).
inline std::vector<std::int64_t> part_shape(const std::vector<std::int64_t>& whole, TensorCut cut, std::int64_t count) {
  PARALLAX_CHECK(cut.dim >= 0 && cut.dim < static_cast<std::int64_t>(whole.size()) && cut.blocks >= 1 && count >= 1,
                 UsageError, "a cut along dimension ", cut.dim, " in ", cut.blocks, " block(s) into ", count,
                 " part(s) does not fit a tensor of ", whole.size(), " dimension(s)");
  const std::int64_t length = whole[static_cast<std::size_t>(cut.dim)];
  PARALLAX_CHECK(length >= 0 && length % cut.blocks == 0, UsageError, "dimension ", cut.dim, " of length ", length,
                 " does not form ", cut.blocks, " equal blocks");
  const std::int64_t block = length / cut.blocks;
  std::vector<std::int64_t> shape = whole;
  shape[static_cast<std::size_t>(cut.dim)] = cut.blocks * (block / count + (block % count != 0 ? 1 : 0));
  return shape;
}

/// Part `index` of `count` of `whole` (a new tensor; padding is zero).
at::Tensor cut(const at::Tensor& whole, TensorCut cut, std::int64_t index, std::int64_t count);

/// Copies `part` (part `index` of `count`) into its place in `whole` (contiguous),
/// padding dropped: what join() does per part, for a caller that holds one part at a time.
void place(at::Tensor& whole, const at::Tensor& part, TensorCut cut, std::int64_t index, std::int64_t count);

/// The tensor of shape `whole` whose parts are `parts` (in part order, each of
/// part_shape(whole, cut, parts.size())): cut()'s inverse, padding dropped. Throws
/// UsageError when a part has another shape.
at::Tensor join(const std::vector<at::Tensor>& parts, TensorCut cut, const std::vector<std::int64_t>& whole);

}  // namespace parallax
