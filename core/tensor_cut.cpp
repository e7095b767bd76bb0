#include "parallax/core/tensor_cut.h"

#include <torch/types.h>

#include <algorithm>

#include "parallax/core/error.h"

namespace parallax {
namespace {

// `shape` with dimension `dim` replaced by [blocks, length].
std::vector<std::int64_t> blocked(std::vector<std::int64_t> shape,
                                  std::int64_t dim,
                                  std::int64_t blocks,
                                  std::int64_t length) {
  shape[static_cast<std::size_t>(dim)] = length;
  shape.insert(shape.begin() + dim, blocks);
  return shape;
}

// The length of each part's chunk of one block.
std::int64_t chunk_length(const std::vector<std::int64_t>& whole, TensorCut cut, std::int64_t count) {
  return part_shape(whole, cut, count)[static_cast<std::size_t>(cut.dim)] / cut.blocks;
}

}  // namespace

torch::Tensor cut(const torch::Tensor& whole, TensorCut cut, std::int64_t index, std::int64_t count) {
  const std::vector<std::int64_t> shape = whole.sizes().vec();
  const std::vector<std::int64_t> out = part_shape(shape, cut, count);
  PARALLAX_CHECK(index >= 0 && index < count, UsageError, "part ", index, " of ", count);
  const std::int64_t block = shape[static_cast<std::size_t>(cut.dim)] / cut.blocks;
  const std::int64_t chunk = chunk_length(shape, cut, count);
  torch::Tensor part = torch::zeros(blocked(shape, cut.dim, cut.blocks, chunk), whole.options().requires_grad(false));
  const std::int64_t begin = std::min(block, index * chunk);
  const std::int64_t real = std::min(block, begin + chunk) - begin;
  if (real > 0) {
    part.narrow(cut.dim + 1, 0, real)
        .copy_(whole.detach().reshape(blocked(shape, cut.dim, cut.blocks, block)).narrow(cut.dim + 1, begin, real));
  }
  return part.reshape(out);
}

void place(torch::Tensor& whole, const torch::Tensor& part, TensorCut cut, std::int64_t index, std::int64_t count) {
  const std::vector<std::int64_t> shape = whole.sizes().vec();
  const std::vector<std::int64_t> expected = part_shape(shape, cut, count);
  PARALLAX_CHECK(index >= 0 && index < count && part.sizes().vec() == expected && whole.is_contiguous(), UsageError,
                 "place: part ", index, " of ", count, " has shape ", part.sizes(), ", expected ",
                 c10::IntArrayRef(expected));
  const std::int64_t block = shape[static_cast<std::size_t>(cut.dim)] / cut.blocks;
  const std::int64_t chunk = chunk_length(shape, cut, count);
  const std::int64_t begin = std::min(block, index * chunk);
  const std::int64_t real = std::min(block, begin + chunk) - begin;
  if (real <= 0) return;
  whole.view(blocked(shape, cut.dim, cut.blocks, block))
      .narrow(cut.dim + 1, begin, real)
      .copy_(part.reshape(blocked(shape, cut.dim, cut.blocks, chunk)).narrow(cut.dim + 1, 0, real));
}

torch::Tensor join(const std::vector<torch::Tensor>& parts, TensorCut cut, const std::vector<std::int64_t>& whole) {
  PARALLAX_CHECK(!parts.empty(), UsageError, "join: no parts");
  torch::Tensor joined = torch::empty(whole, parts.front().options().requires_grad(false));
  for (std::size_t i = 0; i < parts.size(); ++i) {
    place(joined, parts[i].detach(), cut, static_cast<std::int64_t>(i), static_cast<std::int64_t>(parts.size()));
  }
  return joined;
}

}  // namespace parallax
