// FNV-1a over bytes, 64 bits: a hash that is the same on every rank, build and run
// (std::hash promises none of that), for cross-rank checks and file names. Not for
// security.
#pragma once

#include <cstdint>
#include <string_view>

namespace parallax {

inline std::uint64_t fnv1a_64(std::string_view bytes) {
  std::uint64_t hash = 14695981039346656037ull;  // the offset basis
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;  // the prime
  }
  return hash;
}

}  // namespace parallax
