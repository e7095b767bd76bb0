// The conjugate region functions and the column/row-parallel linear layers against the
// dense LibTorch computation they replace: the same seed builds the same dense layer
// and input on every rank; each rank's parallel layer is sliced from it; outputs and
// gradients (of the input, and each rank's slice of the weights) must match the dense
// ones, and the layers must communicate exactly as often as Megatron's do.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "dense_attention.h"
#include "parallax/core/communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/tensor_parallel/parallel_blocks.h"
#include "parallax/tensor_parallel/parallel_linear.h"
#include "parallax/tensor_parallel/regions.h"
#include "parallax/tensor_parallel/vocab_parallel.h"

namespace {

using parallax::CommOp;
using parallax::Communicator;
namespace tp = parallax::tensor_parallel;

class TensorParallel : public ::testing::Test {
 protected:
  void SetUp() override { group_ = parallax::create_mpi_world_communicator(); }
  Communicator& group() { return *group_; }
  int rank() { return group_->rank(); }
  int size() { return group_->size(); }
  // This rank's part of `t` along `dim`.
  torch::Tensor part(const torch::Tensor& t, std::int64_t dim) {
    return t.chunk(size(), dim)[static_cast<std::size_t>(rank())];
  }
  std::unique_ptr<Communicator> group_;
};

constexpr double kTolerance = 1e-5;

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LE(diff, kTolerance) << what << " differs by " << diff;
}

TEST_F(TensorParallel, RegionsAreEachOthersConjugates) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({3, 4 * size()});
  const torch::Tensor upstream = torch::randn({3, 4 * size()});  // d loss / d output, same on all ranks

  // scatter then gather is the identity, and so is its gradient.
  const torch::Tensor leaf = x.clone().requires_grad_(true);
  const torch::Tensor round_trip = tp::gather_from_region(tp::scatter_to_region(leaf, group()), group());
  expect_close(round_trip, x, "scatter→gather");
  round_trip.backward(upstream);
  expect_close(leaf.grad(), upstream, "scatter→gather gradient");

  // copy's backward sums what reduce's forward sums: rank r contributes (r + 1)·x.
  const torch::Tensor mine = x.clone().requires_grad_(true);
  const torch::Tensor reduced = tp::reduce_from_region(mine * (rank() + 1), group());
  const double ranks_sum = size() * (size() + 1) / 2.0;
  expect_close(reduced, x * ranks_sum, "reduce_from_region");
  const torch::Tensor copied_leaf = x.clone().requires_grad_(true);
  tp::copy_to_region(copied_leaf, group()).backward(upstream * (rank() + 1));
  expect_close(copied_leaf.grad(), upstream * ranks_sum, "copy_to_region gradient");
  EXPECT_THROW(tp::scatter_to_region(torch::randn({2, 4 * size() + 1}), group()), parallax::UsageError);
}

// Sequence parallelism's pair, along the sequence dimension of [batch, seq, d]: what
// the gather's forward concatenates, its backward reduce-scatters, and the converse.
TEST_F(TensorParallel, SequenceRegionsAreEachOthersConjugates) {
  torch::manual_seed(2);
  const torch::Tensor full = torch::randn({2, 3 * size(), 4});  // the same on every rank
  const torch::Tensor upstream = torch::randn({2, 3 * size(), 4});
  const torch::Tensor mine = part(full, 1).clone().requires_grad_(true);
  const torch::Tensor gathered = tp::gather_from_sequence_region(mine, group(), 1);
  expect_close(gathered, full, "sequence gather");
  gathered.backward(upstream * (rank() + 1));
  const double ranks_sum = size() * (size() + 1) / 2.0;
  expect_close(mine.grad(), part(upstream, 1) * ranks_sum, "sequence gather gradient (reduce-scatter)");

  const torch::Tensor contribution = (full * (rank() + 1)).requires_grad_(true);
  const torch::Tensor scattered = tp::reduce_scatter_to_sequence_region(contribution, group(), 1);
  expect_close(scattered, part(full, 1) * ranks_sum, "sequence reduce-scatter");
  scattered.backward(part(upstream, 1));
  expect_close(contribution.grad(), upstream, "sequence reduce-scatter gradient (all-gather)");
  EXPECT_THROW(tp::reduce_scatter_to_sequence_region(torch::randn({2, 3 * size() + 1, 4}), group(), 1),
               parallax::UsageError);
}

struct Dense {
  torch::nn::Linear up{nullptr}, down{nullptr};
};

Dense dense_mlp(std::int64_t width, std::int64_t hidden) {
  torch::manual_seed(7);
  return {torch::nn::Linear(width, hidden), torch::nn::Linear(hidden, width)};
}

TEST_F(TensorParallel, ColumnAndRowLayersMatchTheDenseLayers) {
  const std::int64_t width = 6, hidden = 4 * size();
  for (const bool split_inside : {false, true}) {
    Dense dense = dense_mlp(width, hidden);
    tp::ColumnParallelLinear column(dense.up, group(), /*gather_output=*/!split_inside);
    tp::RowParallelLinear row(dense.down, group(), /*input_is_parallel=*/split_inside);
    torch::manual_seed(11);
    const torch::Tensor x = torch::randn({2, 5, width});
    const torch::Tensor upstream = torch::randn({2, 5, width});

    const torch::Tensor dense_x = x.clone().requires_grad_(true);
    const torch::Tensor want = dense.down(torch::gelu(dense.up(dense_x)));
    want.backward(upstream);
    const torch::Tensor parallel_x = x.clone().requires_grad_(true);
    const torch::Tensor got = row(torch::gelu(column(parallel_x)));
    got.backward(upstream);

    expect_close(got, want.detach(), "output");
    expect_close(parallel_x.grad(), dense_x.grad(), "input gradient");
    expect_close(column->weight.grad(), part(dense.up->weight.grad(), 0), "column weight gradient");
    expect_close(column->bias.grad(), part(dense.up->bias.grad(), 0), "column bias gradient");
    expect_close(row->weight.grad(), part(dense.down->weight.grad(), 1), "row weight gradient");
    expect_close(row->bias.grad(), dense.down->bias.grad(), "row bias gradient (replicated)");
  }
}

TEST_F(TensorParallel, AnMlpAllReducesOnceForwardAndOnceBackward) {
  Dense dense = dense_mlp(8, 4 * size());
  tp::ColumnParallelLinear column(dense.up, group(), /*gather_output=*/false);
  tp::RowParallelLinear row(dense.down, group(), /*input_is_parallel=*/true);
  const torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
  const auto before = group().counters();
  const torch::Tensor y = row(torch::gelu(column(x)));
  const auto after_forward = group().counters();
  y.sum().backward();
  const auto after_backward = group().counters();
  const std::int64_t bytes = 4 * 8 * 4;  // [4, 8] fp32
  EXPECT_EQ(after_forward.since(before)[CommOp::kAllReduce].calls, 1);
  EXPECT_EQ(after_forward.since(before)[CommOp::kAllReduce].bytes, bytes);
  EXPECT_EQ(after_backward.since(after_forward)[CommOp::kAllReduce].calls, 1);
  EXPECT_EQ(after_backward.since(after_forward)[CommOp::kAllReduce].bytes, bytes);
  EXPECT_EQ(after_backward.since(before)[CommOp::kAllGather].calls, 0);
}

// A vocabulary that does not divide by tp (padded), every id used.
TEST_F(TensorParallel, VocabParallelEmbeddingMatchesTheDenseEmbedding) {
  const std::int64_t vocab = 4 * size() + 3, dim = 5;
  torch::manual_seed(3);
  torch::nn::Embedding dense(vocab, dim);
  tp::VocabParallelEmbedding parallel(dense, group());
  const torch::Tensor ids = torch::arange(vocab).repeat({2}).view({2, vocab});
  const torch::Tensor upstream = torch::randn({2, vocab, dim});
  const torch::Tensor want = dense(ids);
  want.backward(upstream);
  const torch::Tensor got = parallel(ids);
  got.backward(upstream);
  expect_close(got, want.detach(), "embedding output");
  const tp::VocabRange range = tp::VocabRange::of(vocab, rank(), size());
  const std::int64_t real = std::max<std::int64_t>(0, std::min(range.end, vocab) - range.begin);
  expect_close(parallel->weight.grad().narrow(0, 0, real), dense->weight.grad().narrow(0, range.begin, real),
               "embedding gradient of this rank's rows");
  EXPECT_EQ(parallel->weight.grad().narrow(0, real, range.size() - real).abs().sum().item<double>(), 0.0);
}

TEST_F(TensorParallel, VocabParallelCrossEntropyMatchesTheDenseLossWithoutFullLogits) {
  for (const std::int64_t vocab : {std::int64_t{8} * size(), std::int64_t{8} * size() - 3}) {
    torch::manual_seed(5);
    const torch::Tensor logits = torch::randn({3, 4, vocab}) * 3;
    const torch::Tensor targets = torch::randint(vocab, {3, 4});
    const torch::Tensor dense_logits = logits.clone().requires_grad_(true);
    const torch::Tensor want = torch::nn::functional::cross_entropy(dense_logits.view({-1, vocab}), targets.view({-1}));
    want.backward();
    // This rank's columns of the padded vocabulary (padding columns hold garbage).
    const tp::VocabRange range = tp::VocabRange::of(vocab, rank(), size());
    torch::Tensor part = torch::full({3, 4, range.size()}, 1e4);
    const std::int64_t real = std::max<std::int64_t>(0, std::min(range.end, vocab) - range.begin);
    part.narrow(2, 0, real).copy_(logits.narrow(2, range.begin, real));
    part.requires_grad_(true);
    const torch::Tensor got = tp::vocab_parallel_cross_entropy(part, targets, vocab, group());
    got.backward();
    EXPECT_NEAR(got.item<double>(), want.item<double>(), kTolerance) << "vocabulary " << vocab;
    expect_close(part.grad().narrow(2, 0, real), dense_logits.grad().narrow(2, range.begin, real), "logit gradient");
    EXPECT_EQ(part.grad().narrow(2, real, range.size() - real).abs().sum().item<double>(), 0.0);
  }
}

// The GPT example's attention, written densely: fused qkv, causal softmax, projection.
// (query heads per rank, key/value heads): multi-head, grouped with the key/value heads
// split (kv_heads = tp) and replicated (one key/value head, and two).
class Attention : public TensorParallel, public ::testing::WithParamInterface<std::pair<std::int64_t, std::int64_t>> {};

TEST_P(Attention, SplitHeadsMatchTheDenseAttention) {
  const std::int64_t heads = GetParam().first * size();
  const std::int64_t kv_heads = GetParam().second == -2 ? heads : GetParam().second == -1 ? size() : GetParam().second;
  if (size() % kv_heads != 0 && kv_heads % size() != 0) GTEST_SKIP();
  const std::int64_t head_dim = 4, d = 16;
  torch::manual_seed(13);
  torch::nn::Linear qkv(d, (heads + 2 * kv_heads) * head_dim), proj(heads * head_dim, d);
  tp::ParallelCausalSelfAttention parallel(qkv, proj, heads, kv_heads, group());
  const torch::Tensor x = torch::randn({2, 6, d});
  const torch::Tensor upstream = torch::randn({2, 6, d});
  const torch::Tensor dense_x = x.clone().requires_grad_(true);
  const torch::Tensor want = dense_reference::dense_attention(qkv, proj, heads, kv_heads, dense_x);
  want.backward(upstream);
  const torch::Tensor parallel_x = x.clone().requires_grad_(true);
  const auto before = group().counters();
  const torch::Tensor got = parallel(parallel_x);
  got.backward(upstream);
  const auto comm = group().counters().since(before);
  expect_close(got, want.detach(), "attention output");
  expect_close(parallel_x.grad(), dense_x.grad(), "attention input gradient");
  expect_close(parallel->proj->weight.grad(), part(proj->weight.grad(), 1), "projection weight gradient");
  // This rank's query heads [r·h/tp, (r+1)·h/tp), and its key/value heads: its own
  // 1/tp of them, or the one head its query heads share, with the copies' gradients summed.
  const auto rows = qkv->weight.grad().split({heads * head_dim, kv_heads * head_dim, kv_heads * head_dim}, 0);
  expect_close(parallel->q_weight.grad(), part(rows[0], 0), "query weight gradient");
  const std::int64_t local_kv = std::max<std::int64_t>(1, kv_heads / size());
  const std::int64_t first_kv = kv_heads >= size() ? rank() * local_kv : rank() / (size() / kv_heads);
  const torch::Tensor want_kv = torch::cat({rows[1].narrow(0, first_kv * head_dim, local_kv * head_dim),
                                            rows[2].narrow(0, first_kv * head_dim, local_kv * head_dim)});
  expect_close(parallel->kv_weight.grad(), want_kv, "key/value weight gradient");
  EXPECT_EQ(parallel->kv_copies(), kv_heads >= size() ? 1 : size() / kv_heads);
  // One all-reduce forward, one backward, and one for replicated key/value gradients.
  EXPECT_EQ(comm[CommOp::kAllReduce].calls, kv_heads >= size() ? 2 : 3);
}

INSTANTIATE_TEST_SUITE_P(
    Heads,
    Attention,
    ::testing::Values(std::make_pair(2, -2), std::make_pair(2, -1), std::make_pair(2, 1), std::make_pair(4, 2)),
    [](const auto& info) {
      const auto kv = info.param.second;
      return std::to_string(info.param.first) + "_per_rank_kv" +
             (kv == -2   ? std::string("_all")
              : kv == -1 ? std::string("_tp")
                         : std::to_string(kv));
    });

TEST_F(TensorParallel, AttentionRefusesHeadsThatDoNotSplit) {
  torch::nn::Linear qkv(16, 3 * 16), proj(16, 16);
  EXPECT_THROW(tp::ParallelCausalSelfAttention(qkv, proj, 2 * size() + 1, group()), parallax::UsageError);
  EXPECT_THROW(tp::ParallelCausalSelfAttention(qkv, proj, 4, 3, group()), parallax::UsageError);
}

TEST_F(TensorParallel, MlpMatchesTheDenseMlp) {
  Dense dense = dense_mlp(6, 8 * size());
  tp::ParallelMLP parallel(dense.up, dense.down, group());
  const torch::Tensor x = torch::randn({3, 6});
  expect_close(parallel(x), dense.down(torch::gelu(dense.up(x))).detach(), "MLP output");
}

}  // namespace
