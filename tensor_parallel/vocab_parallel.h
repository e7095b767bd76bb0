// The vocabulary split over a tensor-parallel group: the input embedding and the loss
// over the output logits, neither of which ever holds the full vocabulary on a rank.
//
// The vocabulary V is padded to V' = tp·⌈V/tp⌉; rank r owns ids [r·V'/tp, (r+1)·V'/tp).
// Padding rows are zero in the embedding and masked out of the loss (their logits
// count as −∞), so both compute exactly the dense, unpadded function.
//
//   VocabParallelEmbedding embed(dense_embedding, tp);
//   auto h = embed(ids);                                         // [..., d], all ranks
//   auto logits = output_column_layer(h);                         // [..., V'/tp]
//   auto loss = vocab_parallel_cross_entropy(logits, targets, V, tp);   // mean, all ranks
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "parallax/core/communicator.h"

namespace parallax::tensor_parallel {

/// The rows of a vocabulary of `vocab_size` that rank `rank` of `ranks` owns:
/// [begin, end) of the padded vocabulary, of which ids < vocab_size are real.
struct VocabRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  static VocabRange of(std::int64_t vocab_size, int rank, int ranks);
  std::int64_t size() const { return end - begin; }
};

/// Rows [range.begin, range.end) of `full` ([V, ...]) as a new tensor; rows past V
/// (padding) are zero.
torch::Tensor vocab_rows(const torch::Tensor& full, VocabRange range);

/// This rank's share of an embedding lookup: the rows of `weight_part` (the rows of
/// `range`) for the ids in range, zero for the others. Summed over the group, it is
/// the dense lookup. Local.
torch::Tensor embed_vocab_part(const torch::Tensor& ids, const torch::Tensor& weight_part, VocabRange range);

class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  /// This rank's rows of `dense` (copied; padding rows zero). `tp` must outlive the
  /// layer. Does not communicate.
  VocabParallelEmbeddingImpl(const torch::nn::Embedding& dense, Communicator& tp);
  /// `ids` (int64, any shape, identical on every rank of tp; each in [0, V)) →
  /// [..., embedding_dim], identical on every rank. Collective in forward (one
  /// all-reduce); backward is local.
  torch::Tensor forward(const torch::Tensor& ids);

  torch::Tensor weight;  ///< [V'/tp, embedding_dim]

 private:
  Communicator* tp_;
  VocabRange range_;
};
TORCH_MODULE(VocabParallelEmbedding);

/// Mean cross-entropy of `logits_part` ([..., V'/tp], this rank's columns) against
/// `targets` (int64 [...], each in [0, vocab_size)), identical on every rank; the
/// gradient flows to `logits_part` only (local in backward). Three all-reduces in
/// forward (max, target logit, sum of exponentials), each of one value per token.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_part,
                                           const torch::Tensor& targets,
                                           std::int64_t vocab_size,
                                           Communicator& tp);

}  // namespace parallax::tensor_parallel
