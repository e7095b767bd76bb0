// A decoder-only transformer described by its sizes (the GPT example's [model] table,
// or a published model's), and what the planner needs of it: parameter elements per
// rank, floating-point operations and activation bytes per layer, by the published
// accounting:
//   - parameters: pre-LayerNorm blocks with biases, as examples/gpt builds them
//     (qkv, attention projection, two-layer MLP, two LayerNorms); token and position
//     embeddings; a final LayerNorm and an LM head without bias (or tied);
//   - operations: 2 per multiply-add of every matmul, plus the attention's scores and
//     context (4·b·s²·h forward), backward twice the forward (Narayanan et al., SC'21,
//     "Efficient Large-Scale Language Model Training on GPU Clusters", section 5.1);
//   - activations: Korthikanti et al., "Reducing Activation Recomputation in Large
//     Transformer Models" (MLSys 2023), section 4: sbh(34 + 5as/h) bytes per layer in
//     16-bit with dropout, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism,
//     sbh(34 + 5as/h)/t with sequence parallelism, 2sbh (/t) with full recomputation;
//     written here for any element size, MLP width and key/value heads; with context
//     parallelism over cp ranks every s-long term holds s/cp positions, and the as²
//     scores are the ring's log-sum-exp (as/cp, fp32, beside the kept output), as are
//     fused all-to-all's, or unfused all-to-all's (a/cp)s² of whole-sequence scores
//     (context_parallel/); where whole-sequence scores are kept, so is their s² one-byte
//     causal mask (unfused attention).
#pragma once

#include <cstdint>
#include <string>

namespace parallax {
class AppTable;
}

namespace parallax::planner {

/// How a block's sequence is split over a context-parallel group (context_parallel/).
struct ContextSplit {
  int degree = 1;           ///< cp: the ranks one sequence is split over
  bool all_to_all = false;  ///< heads exchanged (Ulysses) rather than key/value blocks circulated (ring)
  /// All-to-all's attention by a fused kernel that keeps its output and log-sum-exp, not
  /// the scores (scaled_dot_product_attention: context_parallel/ on LibTorch 2.x).
  bool fused = false;
};
struct TransformerShape {
  std::int64_t layers = 2;
  std::int64_t hidden = 64;
  std::int64_t heads = 4;
  std::int64_t kv_heads = 0;    ///< 0 = heads (multi-head attention)
  std::int64_t ffn_hidden = 0;  ///< 0 = 4 × hidden
  std::int64_t vocab = 64;
  std::int64_t seq = 32;
  bool tied_embeddings = false;
  bool dropout = false;  ///< dropout masks kept for the backward (1 byte an element)

  /// From a [model] table in the GPT example's names: n_layer, d_model, n_head,
  /// n_kv_head, d_ff, vocab_size, block_size, tie_embeddings, dropout (defaults as
  /// examples/gpt's). Throws ConfigError naming the key for a value out of range.
  static TransformerShape from_table(const AppTable& table);

  /// A named published model ("megatron-1.7b", "megatron-1t", "gpt3-175b", "llama2-70b"),
  /// its source cited in the .cpp; throws UsageError naming the known ones.
  static TransformerShape preset(const std::string& name);
  static std::string preset_names();

  std::int64_t kv_width() const { return hidden / heads * (kv_heads > 0 ? kv_heads : heads); }
  std::int64_t ffn_width() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }

  /// Parameter elements of one block on one of `tp` tensor-parallel ranks (Megatron's
  /// split: qkv and the MLP's first layer by columns, the projections by rows; the
  /// LayerNorms and the row-split layers' biases whole on every rank).
  std::int64_t block_parameters(int tp = 1) const;
  /// The embeddings (token, split over tp by vocabulary; position, whole).
  std::int64_t embedding_parameters(int tp = 1) const;
  /// The final LayerNorm and the LM head (split over tp by vocabulary; none when tied).
  std::int64_t head_parameters(int tp = 1) const;
  /// The whole model on one rank.
  std::int64_t parameters() const;

  /// Forward operations of one block for `tokens` = micro-batch × sequence tokens,
  /// on one of `tp` ranks.
  double block_forward_flops(std::int64_t micro_batch, int tp = 1) const;
  /// Forward operations of the LM head (and of nothing else in the embeddings).
  double head_forward_flops(std::int64_t micro_batch, int tp = 1) const;
  /// Operations of one training step's forward and backward over `samples` samples,
  /// without recomputation: what MFU counts.
  double model_flops(std::int64_t samples) const;

  /// Activation bytes one block keeps for its backward, per micro-batch, with elements
  /// of `element_bytes`, on one of `tp` ranks, with or without sequence parallelism,
  /// its sequence split as `cp` says.
  std::int64_t block_activation_bytes(std::int64_t micro_batch,
                                      int element_bytes,
                                      int tp,
                                      bool sequence_parallel,
                                      const ContextSplit& cp = {}) const;
  /// With full recomputation: the block's input only.
  std::int64_t block_checkpoint_bytes(std::int64_t micro_batch,
                                      int element_bytes,
                                      int tp,
                                      bool sequence_parallel,
                                      int cp = 1) const;
  /// The head's logits and their gradient in fp32 (the loss is computed in fp32), for
  /// the seq/cp positions one rank holds.
  std::int64_t head_activation_bytes(std::int64_t micro_batch, int tp, int cp = 1) const;

  /// Whether every size (and tying, dropout) equals `other`'s.
  bool same_sizes(const TransformerShape& other) const;

  /// "24 layers, hidden 2304, 24 heads, vocab 51200, sequence 2048: 1.69e9 parameters"
  std::string describe() const;
};

}  // namespace parallax::planner
