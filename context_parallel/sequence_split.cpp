#include "parallax/context_parallel/sequence_split.h"

#include "parallax/core/error.h"

namespace parallax::context_parallel {

SequenceSplit::SequenceSplit(std::int64_t seq_len, int cp, bool load_balance)
    : seq_len_(seq_len), cp_(cp), load_balance_(load_balance) {
  PARALLAX_CHECK(cp >= 1, ConfigError, "the context-parallel degree must be >= 1, got cp = ", cp);
  const std::int64_t unit = 2 * static_cast<std::int64_t>(cp);
  PARALLAX_CHECK(seq_len > 0 && seq_len % unit == 0, ConfigError, "a sequence of ", seq_len,
                 " positions does not split over cp = ", cp, ": context parallelism cuts it into 2 × cp = ", unit,
                 " equal chunks, so the length must be a multiple of ", unit,
                 " (nearest: ", std::max<std::int64_t>(unit, seq_len / unit * unit), " or ",
                 (seq_len / unit + 1) * unit, ")");
}

std::array<int, 2> SequenceSplit::chunks_of(int rank) const {
  PARALLAX_CHECK(rank >= 0 && rank < cp_, UsageError, "rank ", rank, " is outside the context-parallel group of ", cp_);
  if (load_balance_) return {rank, 2 * cp_ - 1 - rank};
  return {2 * rank, 2 * rank + 1};
}

torch::Tensor SequenceSplit::positions(int rank) const {
  const std::int64_t m = chunk_len();
  const auto chunks = chunks_of(rank);
  return torch::cat({torch::arange(chunks[0] * m, (chunks[0] + 1) * m, torch::kLong),
                     torch::arange(chunks[1] * m, (chunks[1] + 1) * m, torch::kLong)});
}

torch::Tensor SequenceSplit::positions_in_rank_order() const {
  std::vector<torch::Tensor> by_rank;
  for (int rank = 0; rank < cp_; ++rank) by_rank.push_back(positions(rank));
  return torch::cat(by_rank);
}

torch::Tensor SequenceSplit::local_part(const torch::Tensor& whole, int rank, std::int64_t dim) const {
  PARALLAX_CHECK(whole.size(dim) == seq_len_, UsageError, "dimension ", dim, " holds ", whole.size(dim),
                 " positions, but the sequence split is for ", seq_len_);
  return whole.index_select(dim, positions(rank).to(whole.device()));
}

torch::Tensor SequenceSplit::whole_from_parts(const std::vector<torch::Tensor>& parts, std::int64_t dim) const {
  PARALLAX_CHECK(static_cast<int>(parts.size()) == cp_, UsageError, "joining ", parts.size(),
                 " parts of a sequence split over cp = ", cp_);
  const torch::Tensor joined = torch::cat(parts, dim);
  // The joined tensor lists positions rank by rank; argsort puts them in sequence order.
  const torch::Tensor order = positions_in_rank_order().argsort().to(joined.device());
  return joined.index_select(dim, order);
}

std::int64_t SequenceSplit::causal_chunk_pairs(int rank) const {
  const auto chunks = chunks_of(rank);
  return (chunks[0] + 1) + (chunks[1] + 1);
}

}  // namespace parallax::context_parallel
