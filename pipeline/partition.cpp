#include "parallax/pipeline/partition.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>

#include "parallax/core/error.h"

namespace parallax::pipeline {

std::vector<std::int64_t> uniform_boundaries(std::int64_t layers, int parts) {
  PARALLAX_CHECK(parts >= 1 && parts <= layers, UsageError, "cannot cut ", layers, " layer(s) into ", parts,
                 " part(s): every part needs a layer");
  std::vector<std::int64_t> boundaries{0};
  const std::int64_t base = layers / parts;
  const std::int64_t larger = layers % parts;
  for (int i = 0; i < parts; ++i) boundaries.push_back(boundaries.back() + base + (i < larger ? 1 : 0));
  return boundaries;
}

std::vector<std::int64_t> balanced_boundaries(const std::vector<double>& weights, int parts) {
  const auto layers = static_cast<int>(weights.size());
  PARALLAX_CHECK(parts >= 1 && parts <= layers, UsageError, "cannot cut ", layers, " layer(s) into ", parts,
                 " part(s): every part needs a layer");
  std::vector<double> prefix(layers + 1, 0.0);
  for (int i = 0; i < layers; ++i) {
    PARALLAX_CHECK(weights[i] >= 0.0, UsageError, "layer ", i, " has a negative weight ", weights[i]);
    prefix[i + 1] = prefix[i] + weights[i];
  }
  auto sum = [&prefix](int from, int to) { return prefix[to] - prefix[from]; };
  // cost[k][j]: (heaviest part, sum of squared part weights) of the best cut of the
  // first j layers into k parts; compared lexicographically.
  using Cost = std::pair<double, double>;
  const Cost kInfinite{std::numeric_limits<double>::infinity(), 0.0};
  std::vector<std::vector<Cost>> cost(parts + 1, std::vector<Cost>(layers + 1, kInfinite));
  std::vector<std::vector<int>> cut(parts + 1, std::vector<int>(layers + 1, 0));
  cost[0][0] = {0.0, 0.0};
  for (int k = 1; k <= parts; ++k) {
    for (int j = k; j <= layers - (parts - k); ++j) {
      for (int i = k - 1; i < j; ++i) {
        if (cost[k - 1][i].first == kInfinite.first) continue;
        const double part = sum(i, j);
        const Cost candidate{std::max(cost[k - 1][i].first, part), cost[k - 1][i].second + part * part};
        if (candidate < cost[k][j]) {
          cost[k][j] = candidate;
          cut[k][j] = i;
        }
      }
    }
  }
  std::vector<std::int64_t> boundaries(parts + 1);
  boundaries[parts] = layers;
  for (int k = parts, j = layers; k > 0; --k) {
    j = cut[k][j];
    boundaries[k - 1] = j;
  }
  return boundaries;
}

std::string describe_boundaries(const std::vector<std::int64_t>& boundaries, const std::vector<double>& weights) {
  std::string text;
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  for (std::size_t i = 0; i + 1 < boundaries.size(); ++i) {
    char part[96];
    std::snprintf(part, sizeof(part), "%s[%lld, %lld)", i ? " " : "", static_cast<long long>(boundaries[i]),
                  static_cast<long long>(boundaries[i + 1]));
    text += part;
    if (!weights.empty() && total > 0) {
      double share = 0.0;
      for (std::int64_t l = boundaries[i]; l < boundaries[i + 1]; ++l) share += weights[l];
      std::snprintf(part, sizeof(part), " %.1f%%", 100.0 * share / total);
      text += part;
    }
  }
  return text;
}

}  // namespace parallax::pipeline
