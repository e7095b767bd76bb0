// Ring attention: scaled dot-product attention over a sequence split across the ranks of
// a context-parallel group, each rank holding its SequenceSplit part of the queries,
// keys and values. Equal to attention over the whole sequence, and each rank keeps only
// 1/cp of the activations.
//
// Protocol, on every rank r of `cp` (C ranks), for one call:
//   Forward
//   a. The rank's own key/value block (K, V of its two chunks) is the first block held.
//   b. For step s = 0 .. C−1 the rank holds the block of rank (r − s) mod C. Before
//      attending to it, it posts the receive of the next block from rank r − 1 and the
//      send of the held one to rank r + 1 (one message, K and V stacked), so the
//      transfer overlaps the attention; it waits for both after attending. C − 1 hops:
//      2(C − 1) key/value blocks sent per call.
//   c. Each of its two query chunks attends to the key chunks of the held block that a
//      causal mask allows (all of them without one): earlier chunks whole, its own chunk
//      under the triangular mask, later chunks skipped, so no score is computed that the
//      mask would discard wholesale. One query chunk against a block's visible chunks is
//      one call of the fused CPU kernel on LibTorch 2.x (two when one is its own chunk;
//      _scaled_dot_product_flash_attention_for_cpu: its output and log-sum-exp, no score
//      matrix), scores and softmax on 1.13.
//   d. Partial results merge exactly by the log-sum-exp rule (online softmax):
//      lse = log(e^lse₁ + e^lse₂), out = out₁·e^(lse₁−lse) + out₂·e^(lse₂−lse).
//   Backward (from the saved output and log-sum-exp; nothing of other ranks is kept)
//   e. The key/value blocks circulate again, C − 1 hops, as in (b).
//   f. With each held block the rank adds its queries' share to that block's key and
//      value gradients (on 2.x the fused kernel's backward, from the whole output and
//      log-sum-exp rows), and to its own queries' gradient. The block's gradients
//      travel with the block: after attending it sends them to
//      rank r + 1 and receives the next block's from rank r − 1. After C such hops every
//      block's gradients are home: 2C gradient blocks sent per call.
// Every rank of `cp` must call it with the same shapes, in the same order (its messages
// are point-to-point); each call blocks until its ring is done and throws CommError when a
// message fails or times out.
//
// Grouped-query attention: keys and values may have fewer heads than the queries (their
// count divides the queries'), and circulate at that size.
//
//   SequenceSplit split(seq_len, cp.size());
//   auto q = split.local_part(q_whole, cp.rank(), 2), ...;          // [B, H, S/cp, D]
//   torch::Tensor out = ring_attention(q, k, v, cp, split);          // [B, H, S/cp, D]
#pragma once

#include <torch/types.h>

#include "parallax/context_parallel/attention_options.h"
#include "parallax/context_parallel/sequence_split.h"
#include "parallax/core/communicator.h"

namespace parallax::context_parallel {

/// Attention of this rank's queries over the whole sequence's keys and values.
/// `q`: [batch, heads, split.local_len(), head_dim]; `k`, `v`: [batch, kv_heads,
/// split.local_len(), head_dim] with kv_heads dividing heads; all of one floating dtype
/// and device; `split.cp()` must equal cp.size(). Returns [batch, heads, local_len,
/// head_dim] in q's dtype, differentiable in q, k and v. `options.method` is not read. Scores and the merge run in
/// float32 for 16-bit inputs. Throws UsageError for shapes that do not fit.
torch::Tensor ring_attention(const torch::Tensor& q,
                             const torch::Tensor& k,
                             const torch::Tensor& v,
                             Communicator& cp,
                             const SequenceSplit& split,
                             const AttentionOptions& options = {});

}  // namespace parallax::context_parallel
