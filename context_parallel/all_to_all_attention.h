// All-to-all (Ulysses) attention: scaled dot-product attention over a sequence split
// across the ranks of a context-parallel group, by trading the sequence split for a head
// split around it (DeepSpeed-Ulysses).
//
// Protocol, on every rank r of `cp` (C ranks), for one call:
//   Forward
//   a. q, k and v (this rank's SequenceSplit part of the sequence, every head) are each
//      exchanged all-to-all: rank r sends its positions of head group j (heads
//      [j·H/C, (j+1)·H/C)) to rank j and receives head group r of every rank's
//      positions. Three exchanges; each sends (C − 1)/C of the tensor.
//   b. Attention runs on the whole sequence for this rank's H/C heads (K/V heads
//      Hkv/C). On LibTorch 2.x by the fused kernel (scaled_dot_product_attention, which
//      keeps no scores for backward), the sequence put in position order for its causal
//      mask and back; on 1.13 by scores, a causal mask built from the global positions
//      and softmax. Every rank computes the same number of scores: balance is built in.
//   c. The output is exchanged back: the fourth exchange.
//   Backward: the same four exchanges in reverse (the output's gradient to heads; the
//   gradients of q, k and v back to the sequence split).
// Each exchange is a send and a receive with every other rank of `cp`, all posted before
// any is waited for. Every rank must call it with the same shapes, in the same order;
// it blocks until done and throws CommError when a message fails or times out.
//
// It moves 4·(C − 1)/C of the activations per layer forward where the ring moves
// 2(C − 1) key/value blocks, and its attention is one whole-sequence block per head
// group: cheaper than the ring when the heads divide by cp (and, with grouped-query
// attention, the key/value heads too). Otherwise use the ring.
//
//   torch::Tensor out = all_to_all_attention(q, k, v, cp, split);    // [B, H, S/cp, D]
#pragma once

#include <torch/types.h>

#include "parallax/context_parallel/attention_options.h"
#include "parallax/context_parallel/sequence_split.h"
#include "parallax/core/communicator.h"

namespace parallax::context_parallel {

/// As ring_attention (same shapes, dtypes and result), by all-to-all. Throws
/// ConfigError when cp.size() does not divide the query heads or the key/value heads
/// (the message names both counts, cp, and the ring as the method that runs), UsageError
/// for shapes that do not fit. `options.method` is not read.
torch::Tensor all_to_all_attention(const torch::Tensor& q,
                                   const torch::Tensor& k,
                                   const torch::Tensor& v,
                                   Communicator& cp,
                                   const SequenceSplit& split,
                                   const AttentionOptions& options = {});

}  // namespace parallax::context_parallel
