// Ring and all-to-all attention on the ranks of the world (cp = 2 or 4) against attention
// over the whole sequence in one process: the same seed gives every rank the same whole
// q, k, v and upstream gradient; each rank takes its SequenceSplit part; its output and
// its parts' gradients must equal the whole computation's, balanced or contiguous, causal
// or not, with as many key/value heads as query heads or fewer. The counters must equal
// the formulas: the score work per rank, and the bytes each method sends.
//
// Mutants these tests catch (each tried once):
//   - all-to-all: the causal mask built from local order instead of the global
//     positions (a balanced split then attends to future keys);
//   - the log-sum-exp merge without rescaling the running output (out += block_out):
//     the outputs differ by O(1);
//   - a block attended as if it came from the wrong rank (chunks_of(r + step) instead of
//     r − step): the causal mask is applied to the wrong keys;
//   - the key/value gradients not sent home on the last hop: dk, dv differ;
//   - the load-balanced split not used for the positions (contiguous chunks): the
//     balanced case's work counters differ between ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>

#include "figures.h"
#include "parallax/context_parallel/attention.h"
#include "parallax/context_parallel/sequence_split.h"
#include "parallax/core/communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"

namespace parallax::context_parallel {
namespace {

// The largest difference between context-parallel and whole attention, relative to the
// largest magnitude of the whole computation's tensor (output or gradient), over every
// rank, in float32. Measured: at most 8.9e-7 for the ring, 3.9e-7 for all-to-all (cp = 2
// and 4, this file's shapes); the bound is about 10× the ring's.
constexpr double kTolerance = 7.5e-6;

struct Shape {
  std::int64_t batch = 2, heads = 8, kv_heads = 8, chunk = 3, head_dim = 8;
};

torch::Tensor whole_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v, bool causal) {
  const std::int64_t group = q.size(1) / k.size(1);
  k = k.repeat_interleave(group, 1);
  v = v.repeat_interleave(group, 1);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  if (causal) {
    const std::int64_t S = q.size(2);
    scores = scores.masked_fill(torch::ones({S, S}, torch::kBool).triu(1), -INFINITY);
  }
  return torch::matmul(torch::softmax(scores, -1), v);
}

double relative_difference(const torch::Tensor& got, const torch::Tensor& want) {
  EXPECT_EQ(got.sizes(), want.sizes());
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

class ContextAttentionTest : public ::testing::TestWithParam<AttentionMethod> {
 protected:
  void SetUp() override {
    cp_ = create_mpi_world_communicator();
    cp_->set_default_timeout(std::chrono::seconds(60));
  }
  Communicator& cp() { return *cp_; }

  // Runs the whole computation and this rank's ring part; returns the largest difference
  // of output and gradients.
  double worst_difference(const Shape& s, bool load_balance, bool causal) {
    const int C = cp().size();
    const std::int64_t S = 2 * C * s.chunk;
    torch::manual_seed(7);
    const torch::Tensor q = torch::randn({s.batch, s.heads, S, s.head_dim}).requires_grad_(true);
    const torch::Tensor k = torch::randn({s.batch, s.kv_heads, S, s.head_dim}).requires_grad_(true);
    const torch::Tensor v = torch::randn({s.batch, s.kv_heads, S, s.head_dim}).requires_grad_(true);
    const torch::Tensor upstream = torch::randn({s.batch, s.heads, S, s.head_dim});
    const torch::Tensor whole = whole_attention(q, k, v, causal);
    whole.backward(upstream);

    const SequenceSplit split(S, C, load_balance);
    auto mine = [&](const torch::Tensor& t) { return split.local_part(t.detach(), cp().rank(), 2); };
    const torch::Tensor ql = mine(q).requires_grad_(true), kl = mine(k).requires_grad_(true),
                        vl = mine(v).requires_grad_(true);
    AttentionOptions options;
    options.method = GetParam();
    options.causal = causal;
    const torch::Tensor out = context_attention(ql, kl, vl, cp(), split, options);
    out.backward(mine(upstream));
    const double mine_worst =
        std::max({relative_difference(out, mine(whole)), relative_difference(ql.grad(), mine(q.grad())),
                  relative_difference(kl.grad(), mine(k.grad())), relative_difference(vl.grad(), mine(v.grad()))});
    torch::Tensor worst = torch::full({1}, mine_worst, torch::kDouble);
    CollectiveOptions max;
    max.reduce_op = ReduceOp::kMax;
    cp().all_reduce(worst, max)->wait();
    return worst.item<double>();
  }

  std::unique_ptr<Communicator> cp_;
};

TEST_P(ContextAttentionTest, EqualsWholeSequenceAttention) {
  double worst = 0;
  for (bool load_balance : {true, false}) {
    for (bool causal : {true, false}) {
      for (std::int64_t kv_heads : {8, 4}) {
        Shape s;
        s.kv_heads = kv_heads;
        const double diff = worst_difference(s, load_balance, causal);
        worst = std::max(worst, diff);
        EXPECT_LE(diff, kTolerance) << "balanced " << load_balance << ", causal " << causal << ", kv_heads "
                                    << kv_heads;
      }
    }
  }
  if (cp().rank() == 0) {
    parallax_test::print_figure(
        "%s, cp = %d: outputs and q/k/v gradients within %.2g of whole-sequence attention (relative; balanced and "
        "contiguous, causal and not, 8 and 4 key/value heads; bound %.2g)\n",
        to_string(GetParam()), cp().size(), worst, kTolerance);
  }
}

// Each rank's causal work, counted in scores. Ring: split.causal_chunk_pairs × chunk²
// per batch element and head, equal on every rank when balanced, growing with the rank
// otherwise ((4·cp − 1)/(2·cp + 1) of the mean on the last). All-to-all: the whole
// sequence's scores for heads/cp heads on every rank, whatever the split.
TEST_P(ContextAttentionTest, WorkCounterShowsTheBalance) {
  const int C = cp().size();
  const Shape s;
  for (bool load_balance : {true, false}) {
    const SequenceSplit split(2 * C * s.chunk, C, load_balance);
    const torch::Tensor q = torch::randn({s.batch, s.heads, split.local_len(), s.head_dim});
    AttentionCounters counters;
    AttentionOptions options;
    options.method = GetParam();
    options.counters = &counters;
    context_attention(q, q, q, cp(), split, options);
    EXPECT_EQ(counters.calls, 1);
    if (GetParam() == AttentionMethod::kRing) {
      const std::int64_t per_pair = s.batch * s.heads * s.chunk * s.chunk;
      EXPECT_EQ(counters.score_elements, split.causal_chunk_pairs(cp().rank()) * per_pair);
    } else {
      EXPECT_EQ(counters.score_elements, s.batch * (s.heads / C) * split.seq_len() * split.seq_len());
    }
    // Every rank's work, gathered.
    torch::Tensor work = torch::zeros({C}, torch::kLong);
    work[cp().rank()] = counters.score_elements;
    cp().all_reduce(work)->wait();
    const double max = work.max().item<double>(), mean = work.to(torch::kDouble).mean().item<double>();
    if (cp().rank() == 0) {
      std::string per_rank;
      for (int rank = 0; rank < C; ++rank) per_rank += " " + std::to_string(work[rank].item<std::int64_t>());
      parallax_test::print_figure("%s, cp = %d, %s split: scores per rank%s, max/mean %.3f\n", to_string(GetParam()),
                                  C, load_balance ? "balanced" : "contiguous", per_rank.c_str(), max / mean);
    }
    if (load_balance || GetParam() == AttentionMethod::kAllToAll) {
      EXPECT_EQ(work.min().item<std::int64_t>(), work.max().item<std::int64_t>());
    } else {
      EXPECT_DOUBLE_EQ(max / mean, (4.0 * C - 1) / (2.0 * C + 1));
    }
  }
}

// Ring forward: C − 1 hops of one message holding K and V (2(C − 1) blocks). Backward:
// C − 1 hops of K and V again, and C hops of their gradients.
TEST_P(ContextAttentionTest, SendsExactlyTheFormulasBytes) {
  const int C = cp().size();
  const Shape s;
  const SequenceSplit split(2 * C * s.chunk, C);
  const torch::Tensor q = torch::randn({s.batch, s.heads, split.local_len(), s.head_dim}).requires_grad_(true);
  const torch::Tensor k = torch::randn({s.batch, s.heads / 2, split.local_len(), s.head_dim}).requires_grad_(true);
  const std::int64_t q_bytes = q.numel() * 4, block_bytes = k.numel() * 4;  // float32
  AttentionOptions options;
  options.method = GetParam();

  const CommCounters before = cp().counters();
  const torch::Tensor out = context_attention(q, k, k, cp(), split, options);
  const CommCounters forward = cp().counters().since(before);
  const CommCounters mid = cp().counters();
  out.sum().backward();
  const CommCounters backward = cp().counters().since(mid);
  if (GetParam() == AttentionMethod::kRing) {
    EXPECT_EQ(forward[CommOp::kSend].calls, C - 1);
    EXPECT_EQ(forward[CommOp::kSend].bytes, 2 * (C - 1) * block_bytes);
    EXPECT_EQ(backward[CommOp::kSend].calls, (C - 1) + C);
    EXPECT_EQ(backward[CommOp::kSend].bytes, 2 * (C - 1) * block_bytes + 2 * C * block_bytes);
  } else {
    // Four exchanges each way (q, k, v, out; then d out, dq, dk, dv), each sending
    // (C − 1)/C of its tensor to the C − 1 other ranks.
    EXPECT_EQ(forward[CommOp::kSend].calls, 4 * (C - 1));
    EXPECT_EQ(forward[CommOp::kSend].bytes, (C - 1) * (2 * q_bytes + 2 * block_bytes) / C);
    EXPECT_EQ(backward[CommOp::kSend].calls, 4 * (C - 1));
    EXPECT_EQ(backward[CommOp::kSend].bytes, (C - 1) * (2 * q_bytes + 2 * block_bytes) / C);
  }
  EXPECT_EQ(forward[CommOp::kRecv].bytes, forward[CommOp::kSend].bytes);
  for (CommOp op : {CommOp::kAllReduce, CommOp::kAllGather, CommOp::kBroadcast}) {
    EXPECT_EQ(forward[op].calls + backward[op].calls, 0) << to_string(op);
  }
}

TEST_P(ContextAttentionTest, ShapesThatDoNotFitAreRefused) {
  const int C = cp().size();
  const SequenceSplit split(2 * C * 3, C);
  AttentionOptions options;
  options.method = GetParam();
  const torch::Tensor q = torch::randn({1, 4, split.local_len(), 8});
  EXPECT_THROW(context_attention(q, q.narrow(2, 0, 1), q, cp(), split, options), UsageError);
  EXPECT_THROW(context_attention(q, q.narrow(1, 0, 3), q.narrow(1, 0, 3), cp(), split, options), UsageError);
  EXPECT_THROW(context_attention(q, q, q, cp(), SequenceSplit(2 * (C + 1) * 3, C + 1), options), UsageError);
}

// All-to-all splits the heads: a count cp does not divide is a ConfigError that names
// the counts and the ring, which runs.
TEST(AllToAllAttention, HeadsThatDoNotDivideAreRefusedNamingTheRing) {
  auto cp = create_mpi_world_communicator();
  const int C = cp->size();
  const SequenceSplit split(2 * C * 3, C);
  const torch::Tensor q = torch::randn({1, 2 * C, split.local_len(), 8});
  const torch::Tensor kv = torch::randn({1, 1, split.local_len(), 8});
  AttentionOptions options;
  options.method = AttentionMethod::kAllToAll;
  try {
    context_attention(q, kv, kv, *cp, split, options);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    const std::string what = error.what();
    for (const std::string& part : {"cp = " + std::to_string(C), std::to_string(2 * C) + " query heads and 1 key/value",
                                    std::string("method = \"ring\"")}) {
      EXPECT_NE(what.find(part), std::string::npos) << part << " missing in: " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Methods,
                         ContextAttentionTest,
                         ::testing::Values(AttentionMethod::kRing, AttentionMethod::kAllToAll),
                         [](const ::testing::TestParamInfo<AttentionMethod>& info) {
                           return std::string(to_string(info.param));
                         });

}  // namespace
}  // namespace parallax::context_parallel
