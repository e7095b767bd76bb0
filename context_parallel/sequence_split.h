// Which positions of a sequence each rank of a context-parallel group holds.
//
// A sequence of S positions is cut into 2·cp chunks of m = S / (2·cp) positions, and
// every rank holds two of them, in this order:
//
//   load-balanced (the default):  rank r holds chunks r and 2·cp − 1 − r
//   contiguous:                   rank r holds chunks 2r and 2r + 1 (positions [r·S/cp, (r+1)·S/cp))
//
//   S = 16, cp = 4, m = 2:   chunks      0  1  2  3  4  5  6  7
//                            balanced    r0 r1 r2 r3 r3 r2 r1 r0
//                            contiguous  r0 r0 r1 r1 r2 r2 r3 r3
//
// Under a causal mask a query attends to the keys at or before it, so the work of a
// chunk grows with its index. Contiguous, the last rank's queries see every key and the
// first rank's almost none: the last does 2·cp/(cp + 1) times the mean work (1.6× at
// cp = 4) and the ring waits for it. Balanced, every rank holds one early and one late
// chunk, and the work is equal (causal_chunk_pairs()). Positions, and whatever is
// indexed by them (position embeddings, targets), follow the same split.
//
// Pure arithmetic and tensor indexing: no communication.
//
//   SequenceSplit split(/*seq_len=*/4096, /*cp=*/4, /*load_balance=*/true);
//   torch::Tensor mine = split.local_part(tokens, cp.rank(), /*dim=*/1);   // [B, 1024]
//   torch::Tensor pos = split.positions(cp.rank());                        // 0..511, 3584..4095
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <vector>

namespace parallax::context_parallel {

class SequenceSplit {
 public:
  /// Throws ConfigError unless cp ≥ 1 and 2·cp divides seq_len (the message names the
  /// sequence length, cp and the nearest lengths that split).
  SequenceSplit(std::int64_t seq_len, int cp, bool load_balance = true);

  std::int64_t seq_len() const { return seq_len_; }
  int cp() const { return cp_; }
  bool load_balance() const { return load_balance_; }
  /// Positions per chunk: seq_len / (2·cp).
  std::int64_t chunk_len() const { return seq_len_ / (2 * cp_); }
  /// Positions each rank holds: seq_len / cp.
  std::int64_t local_len() const { return seq_len_ / cp_; }

  /// The two chunk indices `rank` holds, in the order its local sequence lists them.
  std::array<int, 2> chunks_of(int rank) const;
  /// The global positions `rank` holds, in local order: int64, [local_len()].
  torch::Tensor positions(int rank) const;
  /// Every rank's positions, rank by rank (positions(0), then positions(1), ...): the
  /// order of a tensor joined from every rank's part. int64, [seq_len()].
  torch::Tensor positions_in_rank_order() const;
  /// `rank`'s part of `whole` along `dim` (whose size must be seq_len): a new tensor.
  torch::Tensor local_part(const torch::Tensor& whole, int rank, std::int64_t dim) const;
  /// The inverse: every rank's part (indexed by rank) put back in sequence order along `dim`.
  torch::Tensor whole_from_parts(const std::vector<torch::Tensor>& parts, std::int64_t dim) const;

  /// Under a causal mask, the (query chunk, key chunk) pairs whose scores `rank`
  /// computes: key chunk ≤ query chunk. Its attention work is this × chunk_len()²
  /// scores per batch element and head. Balanced: 2·cp + 1 on every rank; contiguous:
  /// 4r + 3.
  std::int64_t causal_chunk_pairs(int rank) const;

 private:
  std::int64_t seq_len_;
  int cp_;
  bool load_balance_;
};

}  // namespace parallax::context_parallel
