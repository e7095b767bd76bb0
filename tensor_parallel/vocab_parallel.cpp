#include "parallax/tensor_parallel/vocab_parallel.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/embedding.h>

#include <limits>

#include "parallax/core/error.h"
#include "parallax/tensor_parallel/regions.h"

namespace parallax::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

void all_reduce(torch::Tensor& t, Communicator& tp, ReduceOp op) {
  CollectiveOptions options;
  options.reduce_op = op;
  tp.all_reduce(t, options)->wait();
}

// Forward does all the communication; backward is softmax − one-hot on this rank's
// columns, scaled by the incoming gradient of the mean.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx,
                               const torch::Tensor& logits_part,
                               const torch::Tensor& targets,
                               std::int64_t vocab_size,
                               Communicator* tp) {
    const VocabRange range = VocabRange::of(vocab_size, tp->rank(), tp->size());
    PARALLAX_CHECK(logits_part.size(-1) == range.size(), UsageError, "logits_part has ", logits_part.size(-1),
                   " columns; rank ", tp->rank(), " of ", tp->size(), " owns ", range.size(),
                   " of the padded vocabulary ", vocab_size);
    torch::Tensor logits = logits_part.detach().to(torch::kFloat32).reshape({-1, range.size()});
    const torch::Tensor flat_targets = targets.reshape({-1});
    // Padding columns (ids ≥ vocab_size) are not part of the vocabulary.
    const std::int64_t real = std::max<std::int64_t>(0, std::min(range.end, vocab_size) - range.begin);
    if (real < range.size()) logits.narrow(1, real, range.size() - real).fill_(-std::numeric_limits<float>::infinity());

    torch::Tensor max = std::get<0>(logits.max(1));
    all_reduce(max, *tp, ReduceOp::kMax);
    logits = logits - max.unsqueeze(1);

    const torch::Tensor mine = (flat_targets >= range.begin) & (flat_targets < range.end);
    const torch::Tensor local = (flat_targets - range.begin).clamp(0, range.size() - 1);
    torch::Tensor target_logit = logits.gather(1, local.unsqueeze(1)).squeeze(1) * mine;
    all_reduce(target_logit, *tp, ReduceOp::kSum);

    const torch::Tensor exp = logits.exp();
    torch::Tensor sum_exp = exp.sum(1);
    all_reduce(sum_exp, *tp, ReduceOp::kSum);

    const torch::Tensor softmax = exp / sum_exp.unsqueeze(1);
    ctx->save_for_backward({softmax, local, mine});
    ctx->saved_data["shape"] = logits_part.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(logits_part.scalar_type());
    return (sum_exp.log() - target_logit).mean();
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor grad = saved[0].clone();
    grad.scatter_add_(1, saved[1].unsqueeze(1), -saved[2].to(grad.scalar_type()).unsqueeze(1));
    grad.mul_(grads[0] / static_cast<double>(grad.size(0)));
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.view(ctx->saved_data["shape"].toIntVector()).to(dtype), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

VocabRange VocabRange::of(std::int64_t vocab_size, int rank, int ranks) {
  PARALLAX_CHECK(vocab_size >= 1 && ranks >= 1 && rank >= 0 && rank < ranks, UsageError, "vocabulary of ", vocab_size,
                 " over rank ", rank, " of ", ranks);
  const std::int64_t per_rank = (vocab_size + ranks - 1) / ranks;
  return {rank * per_rank, (rank + 1) * per_rank};
}

torch::Tensor vocab_rows(const torch::Tensor& full, VocabRange range) {
  std::vector<std::int64_t> sizes = full.sizes().vec();
  sizes[0] = range.size();
  torch::Tensor part = torch::zeros(sizes, full.options().requires_grad(false));
  const std::int64_t real = std::max<std::int64_t>(0, std::min(range.end, full.size(0)) - range.begin);
  if (real > 0) part.narrow(0, 0, real).copy_(full.detach().narrow(0, range.begin, real));
  return part;
}

torch::Tensor embed_vocab_part(const torch::Tensor& ids, const torch::Tensor& weight_part, VocabRange range) {
  const torch::Tensor mine = (ids >= range.begin) & (ids < range.end);
  const torch::Tensor local = (ids - range.begin) * mine;  // another rank's ids read row 0, then zeroed
  return torch::nn::functional::embedding(local, weight_part) * mine.unsqueeze(-1);
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::nn::Embedding& dense, Communicator& tp) : tp_(&tp) {
  range_ = VocabRange::of(dense->weight.size(0), tp.rank(), tp.size());
  weight = register_parameter("weight", vocab_rows(dense->weight, range_));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  return reduce_from_region(embed_vocab_part(ids, weight, range_), *tp_);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_part,
                                           const torch::Tensor& targets,
                                           std::int64_t vocab_size,
                                           Communicator& tp) {
  return VocabParallelCrossEntropy::apply(logits_part, targets, vocab_size, &tp);
}

}  // namespace parallax::tensor_parallel
