// How one forward's kept choices travel to the ranks holding their experts, and their
// outputs back (the token dispatcher of Megatron-Core's "alltoall" kind).
//
// The experts of a layer are dealt to the expert-parallel group in contiguous blocks:
// rank q of P holds experts [q·E/P, (q+1)·E/P). Protocol, per forward (every rank of
// the group runs it for the same layer, in the same order):
//  a. This rank sorts its kept choices by expert (stably: token order within an
//     expert), so the rows for rank q are one contiguous run.
//  b. The per-expert row counts are exchanged (one all_to_all of E/P int64 per rank), so
//     every rank knows what it will receive from whom.
//  c. dispatch(): the token rows go by all_to_all, then are regrouped from (source rank,
//     expert) to (expert, source rank): each local expert's rows are one run, in the
//     global order of the tokens when ranks hold consecutive slices of the batch.
//  d. The experts run; combine() undoes c (regroup back, all_to_all back) and adds each
//     choice's output times its weight into its token.
// Backward moves the gradients the same ways reversed (dispatch's backward is combine's
// exchange and vice versa). With P = 1 (or no group) nothing is exchanged.
//
//   ExpertDispatch dispatch(routing, n_experts, &ep);
//   torch::Tensor rows = dispatch.dispatch(tokens);        // [Σ rows_per_expert(), hidden]
//   ... each local expert e on its run of rows ...
//   torch::Tensor out = dispatch.combine(expert_rows, routing.weight);   // [tokens, hidden]
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/expert_parallel/routing.h"

namespace parallax::expert_parallel {

class ExpertDispatch {
 public:
  /// Steps a and b. Collective over `ep` when it has more than one rank (null: every
  /// expert is local). Throws UsageError when ep's size does not divide n_experts,
  /// CommError when the exchange fails.
  ExpertDispatch(const Routing& routing, std::int64_t n_experts, Communicator* ep);

  /// Step c: `tokens` [tokens, hidden] → this rank's experts' rows. Differentiable;
  /// collective over ep (in backward too).
  torch::Tensor dispatch(const torch::Tensor& tokens) const;
  /// Step d: `expert_rows` (dispatch()'s rows after the experts) and the routing's
  /// `weight` [tokens, top_k] → [tokens, hidden]; a token whose choices were all dropped
  /// gets zeros. Differentiable in both; collective over ep (in backward too).
  torch::Tensor combine(const torch::Tensor& expert_rows, const torch::Tensor& weight) const;

  /// Rows each local expert takes, in dispatch()'s order (E/P entries).
  const std::vector<std::int64_t>& rows_per_expert() const { return rows_per_expert_; }
  /// Rows this rank sends to each rank of ep (its own included) in dispatch(), and
  /// receives from each; combine() moves them back.
  const std::vector<std::int64_t>& send_rows() const { return send_rows_; }
  const std::vector<std::int64_t>& recv_rows() const { return recv_rows_; }
  /// Bytes this rank's dispatch() and combine() send to other ranks together, for rows of
  /// `row_bytes` (hidden × element size); backward sends as much again.
  std::int64_t exchange_bytes(std::int64_t row_bytes) const;
  /// Bytes of step b's count exchange sent to other ranks (8 × E/P per peer).
  std::int64_t count_bytes() const;

 private:
  Communicator* ep_ = nullptr;  ///< null or one rank: no exchange
  int rank_ = 0;
  int ranks_ = 1;
  std::int64_t top_k_ = 1;
  torch::Tensor choice_;  ///< kept choices (flat index token·k + j), sorted by expert
  torch::Tensor token_;   ///< their tokens
  std::vector<std::int64_t> send_rows_;
  std::vector<std::int64_t> recv_rows_;
  std::vector<std::int64_t> rows_per_expert_;
  torch::Tensor to_expert_order_;  ///< received rows (by source, then expert) → by expert, then source
  torch::Tensor to_source_order_;  ///< its inverse
};

}  // namespace parallax::expert_parallel
