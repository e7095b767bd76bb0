// What a model's layers need to run over a context-parallel group: this rank's part of a
// sequence, the global positions it holds, and attention across the group. The engine
// makes one when parallel.cp > 1 (Engine::context_parallel()) and makes it current for
// the duration of every forward it runs (engine.forward, each pipeline chunk's forward
// and its recompute), so a model's layers find it with current() and need no wiring:
//
//   torch::Tensor tokens = engine.local_batch(batch);           // [B, S/cp]
//   ... inside the model's forward:
//   const auto* cp = parallax::context_parallel::current();     // null at cp = 1
//   torch::Tensor pos = cp ? cp->positions(tokens.size(1)) : torch::arange(tokens.size(1));
//   torch::Tensor y = cp ? cp->attention(q, k, v) : dense_attention(q, k, v);
//
// On LibTorch 2.x the model need not ask: while a Scope is open, every call of
// torch::scaled_dot_product_attention on its thread runs as attention() over the group
// instead (core/operator_interception.h's attention layer), so a model written with SDPA
// gets context parallelism from the config alone. Its positions must still be this
// rank's (positions(), or computed from the batch the engine split).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>

#include "parallax/context_parallel/attention_options.h"
#include "parallax/context_parallel/sequence_split.h"
#include "parallax/core/communicator.h"

namespace parallax::interception {
class Scope;
}  // namespace parallax::interception

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
  /// The same with this call's mask and scale instead of the handle's (`scale` 0 means
  /// 1/√head_dim): what an intercepted scaled_dot_product_attention runs.
  torch::Tensor attention(const torch::Tensor& q,
                          const torch::Tensor& k,
                          const torch::Tensor& v,
                          bool causal,
                          double scale) const;
  /// What the attention calls did so far on this rank.
  const AttentionCounters& counters() const { return counters_; }

  /// While alive, current() on this thread is this handle (the one before comes back
  /// when it ends; scopes nest), and on LibTorch 2.x scaled_dot_product_attention runs
  /// as this handle's attention. The engine holds one around each forward.
  class Scope {
   public:
    explicit Scope(const ContextParallel& handle);
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();

   private:
    const ContextParallel* previous_;
    std::unique_ptr<interception::Scope> intercepting_;  ///< null where SDPA does not exist
  };

 private:
  Communicator* group_;
  AttentionOptions options_;
  bool load_balance_;
  std::int64_t sequence_dim_;
  mutable AttentionCounters counters_;
};

/// The handle of the innermost open Scope on this thread; null outside every scope (a
/// forward at cp = 1, or a model run outside the engine).
const ContextParallel* current();

}  // namespace parallax::context_parallel
