// What a model's layers need to run over a context-parallel group: this rank's part of a
// sequence, the global positions it holds, and attention across the group. The engine
// makes one when parallel.cp > 1 (Engine::context_parallel()); a model keeps it and
// calls it where it would compute over the whole sequence.
//
//   auto cp = engine.context_parallel();                        // null at cp = 1
//   torch::Tensor tokens = engine.local_batch(batch);           // [B, S/cp]
//   torch::Tensor pos = cp ? cp->positions(tokens.size(1)) : torch::arange(tokens.size(1));
//   torch::Tensor y = cp ? cp->attention(q, k, v) : dense_attention(q, k, v);
#pragma once

#include <torch/types.h>

#include <cstdint>

#include "parallax/context_parallel/attention_options.h"
#include "parallax/context_parallel/sequence_split.h"
#include "parallax/core/communicator.h"

namespace parallax::context_parallel {

class ContextParallel {
 public:
  /// Over `group` (which must outlive it): attention by `options` (method, causal,
  /// scale; its counters are this object's), the load-balanced split or not, and the
  /// batch tensors' sequence dimension.
  ContextParallel(Communicator& group, AttentionOptions options, bool load_balance, std::int64_t sequence_dim);
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;

  int size() const { return group_->size(); }
  int rank() const { return group_->rank(); }
  Communicator& group() const { return *group_; }
  bool load_balance() const { return load_balance_; }
  std::int64_t sequence_dim() const { return sequence_dim_; }

  /// The split of a sequence of `seq_len` positions over the group.
  SequenceSplit split(std::int64_t seq_len) const { return SequenceSplit(seq_len, size(), load_balance_); }
  /// This rank's part of `whole` along sequence_dim(): a new tensor. Throws ConfigError
  /// when 2·cp does not divide that dimension (naming it), UsageError when `whole` has
  /// no such dimension.
  torch::Tensor local_part(const torch::Tensor& whole) const;
  /// The global positions of this rank's `local_len` positions: int64 [local_len].
  torch::Tensor positions(std::int64_t local_len) const;
  /// context_attention over the group of this rank's q, k, v ([batch, heads, local_len,
  /// head_dim]); collective over the group.
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const;
  /// What the attention calls did so far on this rank.
  const AttentionCounters& counters() const { return counters_; }

 private:
  Communicator* group_;
  AttentionOptions options_;
  bool load_balance_;
  std::int64_t sequence_dim_;
  mutable AttentionCounters counters_;
};

}  // namespace parallax::context_parallel
