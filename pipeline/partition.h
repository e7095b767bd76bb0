// Cutting a sequence of layers into contiguous parts (pure arithmetic).
//
// Boundaries are [0, b1, ..., layers]: part i holds layers [b_i, b_{i+1}). Every part
// holds at least one layer.
//
//   auto cut = pipeline::balanced_boundaries({1, 4, 4, 4, 4, 2}, 3);   // {0, 2, 4, 6}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace parallax::pipeline {

/// `parts` parts of `layers` layers whose sizes differ by at most one, the larger
/// ones first. Requires 1 <= parts <= layers (UsageError otherwise).
std::vector<std::int64_t> uniform_boundaries(std::int64_t layers, int parts);

/// The contiguous cut into `parts` parts whose heaviest part is as light as possible
/// (exact, by dynamic programming over the prefix sums; among equally heavy cuts, the
/// one whose parts' weights are most even). `weights` are per layer, >= 0 (e.g.
/// parameter counts or milliseconds). Requires 1 <= parts <= weights.size().
std::vector<std::int64_t> balanced_boundaries(const std::vector<double>& weights, int parts);

/// "[0, 3) [3, 6) [6, 8)" with each part's share of `weights` when given.
std::string describe_boundaries(const std::vector<std::int64_t>& boundaries, const std::vector<double>& weights = {});

}  // namespace parallax::pipeline
