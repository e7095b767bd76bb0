#include "parallax/core/error.h"

#include <atomic>

namespace parallax {
namespace {
// Written once by World::init; see the contract in error.h.
std::atomic<int> g_process_rank{-1};
}  // namespace

void set_process_rank(int rank) {
  g_process_rank.store(rank);
}

int process_rank() {
  return g_process_rank.load();
}

std::string rank_prefix() {
  const int rank = process_rank();
  return rank < 0 ? std::string("[rank ?] ") : "[rank " + std::to_string(rank) + "] ";
}

Error::Error(const std::string& kind, const std::string& detail)
    : std::runtime_error(rank_prefix() + kind + ": " + detail), kind_(kind), detail_(detail) {}

}  // namespace parallax
