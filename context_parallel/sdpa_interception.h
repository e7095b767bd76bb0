// scaled_dot_product_attention, intercepted: while a ContextParallel::Scope is open on
// LibTorch 2.x, each call of the operator on its thread runs as that handle's attention
// over the cp group (core/operator_interception.h's attention layer). Internal to
// context_parallel/: ContextParallel::Scope opens it.
#pragma once

#include <memory>

#include "parallax/core/operator_interception.h"

namespace parallax::context_parallel {

class ContextParallel;

/// The scope that routes scaled_dot_product_attention to `handle.attention(...)`, the
/// layer claimed first if need be; null on LibTorch 1.13, which has no such operator.
/// Each intercepted call takes the operator's own is_causal and scale, and throws
/// UsageError for what context parallelism cannot split: an attn_mask (its rows and
/// columns would have to follow the sequence split), a dropout_p other than 0, inputs
/// that are not [batch, heads, positions, head_dim], or key/value heads fewer than the
/// query heads without enable_gqa.
std::unique_ptr<interception::Scope> intercept_sdpa(const ContextParallel& handle);

}  // namespace parallax::context_parallel
