// Tests of the MPI communicator, run on 1, 2 and 4 ranks (mpirun). Inputs are small
// integers so every reduction is exact in every dtype (bfloat16 included) and in any
// order: rank r contributes (r + 1) × a pattern.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "parallax/core/communicator.h"
#include "parallax/core/device_routed_communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/world.h"

namespace parallax {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kLong,
                                             at::kHalf,  at::kInt,    at::kByte};
const std::vector<at::ScalarType> kFloatDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

// 1, 2, ..., period, 1, 2, ... (n elements, int64).
at::Tensor pattern(std::int64_t n, std::int64_t period) {
  return at::remainder(at::arange(n, at::kLong), period).add(1);
}

::testing::AssertionResult same_values(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() == expected.sizes() && at::equal(actual.to(at::kDouble), expected.to(at::kDouble))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << actual.to(at::kDouble).slice(0, 0, 8) << "\nexpected "
                                       << expected.to(at::kDouble).slice(0, 0, 8);
}

class CommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = create_mpi_world_communicator();
    world_->set_default_timeout(milliseconds(30'000));  // a failing test errors, never hangs
  }
  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  // Sum over ranks of (r + 1).
  std::int64_t rank_sum() const { return static_cast<std::int64_t>(size()) * (size() + 1) / 2; }

  std::unique_ptr<Communicator> world_;
};

TEST_F(CommTest, WorldIdentity) {
  int mpi_rank = -1;
  int mpi_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  EXPECT_EQ(world_->rank(), mpi_rank);
  EXPECT_EQ(world_->size(), mpi_size);
  EXPECT_EQ(world_->name(), "world");
  EXPECT_STREQ(world_->backend(), "mpi");
  EXPECT_EQ(world_->default_timeout(), milliseconds(30'000));
}

TEST_F(CommTest, AllReduceSumEveryDtype) {
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor tensor = pattern(1000, 7).mul(rank() + 1).to(dtype);
    world_->all_reduce(tensor)->wait();
    EXPECT_TRUE(same_values(tensor, pattern(1000, 7).mul(rank_sum())));
  }
}

TEST_F(CommTest, AllReduceAvgMaxMin) {
  for (auto dtype : kFloatDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor tensor = pattern(999, 7).mul(rank() + 1).to(dtype);
    world_->all_reduce(tensor, {ReduceOp::kAvg})->wait();
    // mean of (r + 1) = (size + 1) / 2: halves are exact in every float dtype.
    EXPECT_TRUE(same_values(tensor, pattern(999, 7).to(at::kDouble).mul((size() + 1) / 2.0)));
  }
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor high = pattern(500, 5).mul(rank() + 1).to(dtype);
    at::Tensor low = high.clone();
    auto high_work = world_->all_reduce(high, {ReduceOp::kMax});
    auto low_work = world_->all_reduce(low, {ReduceOp::kMin});
    high_work->wait();
    low_work->wait();
    EXPECT_TRUE(same_values(high, pattern(500, 5).mul(size())));
    EXPECT_TRUE(same_values(low, pattern(500, 5)));
  }
}

TEST_F(CommTest, EmptyTensorIsFine) {
  at::Tensor empty = at::zeros({0}, at::kFloat);
  world_->all_reduce(empty)->wait();
  world_->broadcast(empty, 0)->wait();
  EXPECT_EQ(empty.numel(), 0);
}

TEST_F(CommTest, ReduceScatter) {
  const std::int64_t shard = 300;
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    // Chunk c of rank r holds (r + 1) × (c + pattern).
    at::Tensor input = at::empty({size() * shard}, at::kLong);
    for (int c = 0; c < size(); ++c) input.narrow(0, c * shard, shard).copy_(pattern(shard, 3).add(c));
    input = input.mul(rank() + 1).to(dtype);
    at::Tensor output = at::zeros({shard}, dtype);
    world_->reduce_scatter(output, input)->wait();
    EXPECT_TRUE(same_values(output, pattern(shard, 3).add(rank()).mul(rank_sum())));
  }
  at::Tensor input = at::ones({size() * shard}, at::kFloat).mul(rank() + 1);
  at::Tensor output = at::zeros({shard}, at::kFloat);
  world_->reduce_scatter(output, input, {ReduceOp::kAvg})->wait();
  EXPECT_TRUE(same_values(output, at::full({shard}, (size() + 1) / 2.0, at::kDouble)));
}

TEST_F(CommTest, AllGather) {
  const std::int64_t shard = 257;
  for (auto dtype : kDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    at::Tensor input = pattern(shard, 8).add(8 * rank()).to(dtype);
    at::Tensor output = at::zeros({size() * shard}, dtype);
    world_->all_gather(output, input)->wait();
    for (int q = 0; q < size(); ++q) {
      EXPECT_TRUE(same_values(output.narrow(0, q * shard, shard), pattern(shard, 8).add(8 * q)));
    }
  }
  // In place: this rank's input is already its chunk of the output.
  at::Tensor output = at::zeros({size() * shard}, at::kDouble);
  at::Tensor own = output.narrow(0, rank() * shard, shard);
  own.copy_(pattern(shard, 8).add(8 * rank()));
  world_->all_gather(output, own)->wait();
  for (int q = 0; q < size(); ++q) {
    EXPECT_TRUE(same_values(output.narrow(0, q * shard, shard), pattern(shard, 8).add(8 * q)));
  }
}

TEST_F(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      at::Tensor tensor = rank() == root ? pattern(100, 9).add(root).to(dtype) : at::zeros({100}, dtype);
      world_->broadcast(tensor, root)->wait();
      EXPECT_TRUE(same_values(tensor, pattern(100, 9).add(root)));
    }
  }
}

TEST_F(CommTest, SendRecvRing) {
  const int next = (rank() + 1) % size();
  const int prev = (rank() + size() - 1) % size();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    at::Tensor out = pattern(4096, 11).add(rank()).to(dtype);
    at::Tensor in = at::zeros({4096}, dtype);
    auto sent = world_->send(out, next, /*tag=*/3);
    auto received = world_->recv(in, prev, /*tag=*/3);
    received->wait();
    sent->wait();
    EXPECT_TRUE(same_values(in, pattern(4096, 11).add(prev)));
  }
  // Tags keep messages apart: two messages posted in one order, received in the other.
  at::Tensor a = at::full({64}, 10.0 + rank());
  at::Tensor b = at::full({128}, 20.0 + rank());
  at::Tensor got_a = at::zeros({64});
  at::Tensor got_b = at::zeros({128});
  auto send_a = world_->send(a, next, 1);
  auto send_b = world_->send(b, next, 2);
  auto recv_b = world_->recv(got_b, prev, 2);
  auto recv_a = world_->recv(got_a, prev, 1);
  recv_a->wait();
  recv_b->wait();
  send_b->wait();
  send_a->wait();
  EXPECT_TRUE(same_values(got_a, at::full({64}, 10.0 + prev)));
  EXPECT_TRUE(same_values(got_b, at::full({128}, 20.0 + prev)));
}

// Rank r sends q + r + 1 rows to rank q (none to itself on even ranks), each row
// holding (sender, receiver, row index); every rank finds each sender's rows in order.
TEST_F(CommTest, AllToAllMovesEachRanksRowsToTheirRank) {
  const int n = size();
  const int r = rank();
  auto rows = [](int from, int to) -> std::int64_t { return from % 2 == 0 && from == to ? 0 : to + from + 1; };
  std::vector<std::int64_t> send_rows(n), recv_rows(n);
  for (int q = 0; q < n; ++q) {
    send_rows[q] = rows(r, q);
    recv_rows[q] = rows(q, r);
  }
  std::vector<double> values;
  for (int q = 0; q < n; ++q) {
    for (std::int64_t i = 0; i < send_rows[q]; ++i) values.insert(values.end(), {double(r), double(q), double(i)});
  }
  at::Tensor input = at::tensor(values, at::kDouble).view({-1, 3});
  std::int64_t total = 0;
  for (std::int64_t k : recv_rows) total += k;
  at::Tensor output = at::full({total, 3}, -1.0, at::kDouble);
  world_->all_to_all(output, recv_rows, input, send_rows)->wait();
  std::int64_t at_row = 0;
  for (int q = 0; q < n; ++q) {
    for (std::int64_t i = 0; i < recv_rows[q]; ++i, ++at_row) {
      const auto row = output[at_row];
      EXPECT_EQ(row[0].item<double>(), q);
      EXPECT_EQ(row[1].item<double>(), r);
      EXPECT_EQ(row[2].item<double>(), i);
    }
  }
  // Counts that do not sum to the rows, or one per rank missing, are refused by name.
  std::vector<std::int64_t> short_list(n > 1 ? n - 1 : 2, 0);
  EXPECT_THROW(world_->all_to_all(output, recv_rows, input, short_list), UsageError);
  std::vector<std::int64_t> too_many = send_rows;
  too_many[0] += 1;
  try {
    world_->all_to_all(output, recv_rows, input, too_many);
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("input_rows sums to"), std::string::npos) << e.what();
  }
}

TEST_F(CommTest, ManyOpsInFlightWaitedOutOfOrder) {
  // More operations than the engine keeps in flight at once, waited in reverse.
  std::vector<at::Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 100; ++i) {
    tensors.push_back(at::full({i + 1}, static_cast<double>(i + rank()), at::kDouble));
    works.push_back(world_->all_reduce(tensors.back()));
  }
  at::Tensor broadcasted = rank() == 0 ? at::full({33}, 7, at::kLong) : at::zeros({33}, at::kLong);
  works.push_back(world_->broadcast(broadcasted, 0));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  for (int i = 0; i < 100; ++i) {
    // sum over r of (i + r) = size × i + size(size - 1)/2
    const double expected = static_cast<double>(size()) * i + size() * (size() - 1) / 2.0;
    EXPECT_TRUE(same_values(tensors[i], at::full({i + 1}, expected, at::kDouble))) << i;
  }
  EXPECT_TRUE(same_values(broadcasted, at::full({33}, 7, at::kLong)));
  for (auto& work : works) EXPECT_TRUE(work->is_completed());
}

TEST_F(CommTest, BigAllReduceProgressesWhileCallerComputes) {
  at::Tensor big = at::ones({4 << 20}, at::kFloat).mul(rank() + 1);  // 16 MiB
  auto work = world_->all_reduce(big);
  // The caller never enters the communicator: only the progress thread moves data.
  at::Tensor a = at::rand({64, 64});
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  int rounds = 0;
  while (!work->is_completed() && Clock::now() < give_up) {
    a = at::matmul(a, a).div_(64);
    ++rounds;
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_TRUE(work->is_completed()) << "after " << rounds << " rounds of caller work";
  work->wait();
  EXPECT_TRUE(same_values(big.slice(0, 0, 16), at::full({16}, rank_sum(), at::kDouble)));
  EXPECT_EQ(big.sum().item<double>(), static_cast<double>(rank_sum()) * (4 << 20));
}

TEST_F(CommTest, SplitEvenOdd) {
  // An operation still in flight when split is called: split keeps its place in line.
  at::Tensor before = at::full({1 << 16}, 1.0);
  auto before_work = world_->all_reduce(before);
  auto half = world_->split(rank() % 2, rank(), rank() % 2 == 0 ? "even" : "odd");
  before_work->wait();
  EXPECT_TRUE(same_values(before.slice(0, 0, 4), at::full({4}, static_cast<double>(size()))));
  const int members = (size() + 1 - rank() % 2) / 2;
  EXPECT_EQ(half->size(), members);
  EXPECT_EQ(half->rank(), rank() / 2);
  EXPECT_EQ(half->name(), rank() % 2 == 0 ? "even" : "odd");
  EXPECT_EQ(half->default_timeout(), world_->default_timeout());
  at::Tensor tensor = at::full({10}, rank() + 1, at::kLong);
  half->all_reduce(tensor)->wait();
  std::int64_t expected = 0;
  for (int r = rank() % 2; r < size(); r += 2) expected += r + 1;
  EXPECT_TRUE(same_values(tensor, at::full({10}, expected, at::kLong)));
  // Collectives on the parent still work, interleaved with the child's.
  at::Tensor whole = at::full({3}, 1.0);
  auto parent_work = world_->all_reduce(whole);
  auto child_work = half->barrier();
  parent_work->wait();
  child_work->wait();
  EXPECT_TRUE(same_values(whole, at::full({3}, static_cast<double>(size()))));
  // key orders the new ranks: reversed keys reverse them.
  auto reversed = world_->split(0, size() - rank(), "reversed");
  EXPECT_EQ(reversed->rank(), size() - 1 - rank());
  at::Tensor root_value = at::full({1}, reversed->rank() == 0 ? 42.0 : 0.0);
  reversed->broadcast(root_value, 0)->wait();
  EXPECT_EQ(root_value.item<double>(), 42.0);
  EXPECT_EQ(world_->counters()[CommOp::kBarrier].calls, 0) << "split must not count as a barrier";
}

TEST_F(CommTest, CountersAreExact) {
  const int n = size();
  at::Tensor f32 = at::ones({1000}, at::kFloat);
  world_->all_reduce(f32)->wait();
  world_->all_reduce(f32, {ReduceOp::kMax})->wait();
  at::Tensor rs_in = at::ones({n * 10}, at::kDouble);
  at::Tensor rs_out = at::zeros({10}, at::kDouble);
  world_->reduce_scatter(rs_out, rs_in)->wait();
  at::Tensor ag_in = at::ones({10}, at::kLong);
  at::Tensor ag_out = at::zeros({n * 10}, at::kLong);
  world_->all_gather(ag_out, ag_in)->wait();
  at::Tensor bc = at::ones({7}, at::kBFloat16);
  world_->broadcast(bc, 0)->wait();
  at::Tensor message = at::ones({5}, at::kInt);
  at::Tensor inbox = at::zeros({5}, at::kInt);
  auto s = world_->send(message, (rank() + 1) % n, 0);
  world_->recv(inbox, (rank() + n - 1) % n, 0)->wait();
  s->wait();
  for (int i = 0; i < 3; ++i) world_->barrier()->wait();
  // all_to_all: two float rows of 3 to every rank; only what leaves this rank counts.
  at::Tensor a2a_in = at::ones({2 * n, 3});
  at::Tensor a2a_out = at::zeros({2 * n, 3});
  const std::vector<std::int64_t> two_each(n, 2);
  world_->all_to_all(a2a_out, two_each, a2a_in, two_each)->wait();
  // Rejected calls are not counted.
  EXPECT_THROW(world_->broadcast(bc, n), UsageError);

  const CommCounters c = world_->counters();
  EXPECT_EQ(c[CommOp::kAllReduce].calls, 2);
  EXPECT_EQ(c[CommOp::kAllReduce].bytes, 2 * 4000);
  EXPECT_EQ(c[CommOp::kReduceScatter].calls, 1);
  EXPECT_EQ(c[CommOp::kReduceScatter].bytes, n * 10 * 8);
  EXPECT_EQ(c[CommOp::kAllGather].calls, 1);
  EXPECT_EQ(c[CommOp::kAllGather].bytes, n * 10 * 8);
  EXPECT_EQ(c[CommOp::kBroadcast].calls, 1);
  EXPECT_EQ(c[CommOp::kBroadcast].bytes, 14);
  EXPECT_EQ(c[CommOp::kSend].calls, 1);
  EXPECT_EQ(c[CommOp::kSend].bytes, 20);
  EXPECT_EQ(c[CommOp::kRecv].calls, 1);
  EXPECT_EQ(c[CommOp::kRecv].bytes, 20);
  EXPECT_EQ(c[CommOp::kBarrier].calls, 3);
  EXPECT_EQ(c[CommOp::kBarrier].bytes, 0);
  EXPECT_EQ(c[CommOp::kAllToAll].calls, 1);
  EXPECT_EQ(c[CommOp::kAllToAll].bytes, (n - 1) * 2 * 3 * 4);
  for (const OpCounter& op : c.ops) EXPECT_GT(op.nanoseconds, 0);

  world_->all_reduce(f32)->wait();
  const CommCounters delta = world_->counters().since(c);
  EXPECT_EQ(delta[CommOp::kAllReduce].calls, 1);
  EXPECT_EQ(delta[CommOp::kAllReduce].bytes, 4000);
  EXPECT_EQ(delta[CommOp::kBroadcast].calls, 0);
}

// The counters' split by node. The world's ranks are labelled as two nodes, the lower
// half and the upper half (as two 2-rank hosts would be), and a group that stays within
// each half is split off. Mutants caught: a send counted by the sender's node instead of
// the peer's, a collective over a spanning group counted as intra-node, the labels not
// passed to a group made by split (its bytes would all be intra-node, silently).
TEST_F(CommTest, CountersSplitBytesByNode) {
  const int n = size();
  std::vector<int> nodes;
  for (int r = 0; r < n; ++r) nodes.push_back(r < (n + 1) / 2 ? 0 : 1);
  world_->set_member_nodes(nodes);
  EXPECT_EQ(world_->spans_nodes(), n > 1);
  EXPECT_THROW(world_->set_member_nodes(std::vector<int>(static_cast<std::size_t>(n) + 1, 0)), UsageError);
  EXPECT_THROW(world_->set_member_nodes({}), UsageError);  // one node per rank

  at::Tensor f32 = at::ones({100}, at::kFloat);
  world_->all_reduce(f32)->wait();
  at::Tensor message = at::ones({5}, at::kInt);
  at::Tensor inbox = at::zeros({5}, at::kInt);
  const int next = (rank() + 1) % n;
  const int previous = (rank() + n - 1) % n;
  auto s = world_->send(message, next, 0);
  world_->recv(inbox, previous, 0)->wait();
  s->wait();
  const CommCounters c = world_->counters();
  EXPECT_EQ(c[CommOp::kAllReduce].inter_node_bytes, n > 1 ? 400 : 0);
  EXPECT_EQ(c[CommOp::kSend].inter_node_bytes, nodes[next] != nodes[rank()] ? 20 : 0);
  EXPECT_EQ(c[CommOp::kRecv].inter_node_bytes, nodes[previous] != nodes[rank()] ? 20 : 0);

  // A group inside one node: labelled by whoever splits it, its bytes are intra-node.
  auto half = world_->split(nodes[rank()], rank(), "half");
  std::vector<int> half_nodes(static_cast<std::size_t>(half->size()), nodes[rank()]);
  half->set_member_nodes(half_nodes);
  EXPECT_FALSE(half->spans_nodes());
  half->all_reduce(f32)->wait();
  EXPECT_EQ(half->counters()[CommOp::kAllReduce].bytes, 400);
  EXPECT_EQ(half->counters()[CommOp::kAllReduce].inter_node_bytes, 0);
  const CommCounters since = world_->counters().since(c);
  EXPECT_EQ(since[CommOp::kAllReduce].inter_node_bytes, 0);
  CommCounters total = c;
  total += c;
  EXPECT_EQ(total[CommOp::kAllReduce].inter_node_bytes, 2 * c[CommOp::kAllReduce].inter_node_bytes);
}

// A group over two backends sends each tensor to the backend of its device: host
// tensors to the host communicator, with exact results; its splits route alike, and its
// counters are both backends'. Here both halves are MPI groups (no CUDA tensor exists
// on this machine), so the CUDA half must stay untouched. Mutant caught: routing by
// anything but the tensor's device (every op would land on the CUDA half).
TEST_F(CommTest, ARoutedGroupSendsHostTensorsToItsHostBackend) {
  auto host_half = world_->split(0, rank(), "host half");
  auto cuda_half = world_->split(0, rank(), "cuda half");
  Communicator* host = host_half.get();
  Communicator* cuda = cuda_half.get();
  auto routed = route_by_device(std::move(host_half), std::move(cuda_half));
  EXPECT_STREQ(routed->backend(), "mpi+mpi");
  EXPECT_EQ(routed->name(), "host half");
  at::Tensor values = pattern(10, 4).mul(rank() + 1);
  routed->all_reduce(values)->wait();
  EXPECT_TRUE(same_values(values, pattern(10, 4).mul(rank_sum())));
  at::Tensor gathered = at::zeros({size() * 3}, at::kLong);
  routed->all_gather(gathered, at::full({3}, rank(), at::kLong))->wait();
  for (int r = 0; r < size(); ++r) EXPECT_EQ(gathered[r * 3].item<std::int64_t>(), r);
  routed->barrier()->wait();
  EXPECT_EQ(host->counters()[CommOp::kAllReduce].calls, 1);
  EXPECT_EQ(host->counters()[CommOp::kAllGather].calls, 1);
  EXPECT_EQ(cuda->counters()[CommOp::kAllReduce].calls + cuda->counters()[CommOp::kAllGather].calls +
                cuda->counters()[CommOp::kBarrier].calls,
            0);
  EXPECT_EQ(routed->counters()[CommOp::kAllReduce].bytes, host->counters()[CommOp::kAllReduce].bytes);

  auto pair = routed->split(rank() / 2, rank(), "pair");
  EXPECT_STREQ(pair->backend(), "mpi+mpi");
  at::Tensor one = at::ones({5});
  pair->all_reduce(one)->wait();
  EXPECT_EQ(one[0].item<float>(), static_cast<float>(std::min(2, size() - (rank() / 2) * 2)));
  EXPECT_EQ(pair->counters()[CommOp::kAllReduce].calls, 1);
}

TEST_F(CommTest, BadArgumentsThrow) {
  const int n = size();
  at::Tensor matrix = at::zeros({4, 6});
  at::Tensor strided = matrix.t();
  EXPECT_THROW(world_->all_reduce(strided), UsageError);
  at::Tensor undefined;
  EXPECT_THROW(world_->all_reduce(undefined), UsageError);
  at::Tensor flags = at::zeros({4}, at::kBool);
  EXPECT_THROW(world_->all_reduce(flags), UsageError);
  at::Tensor ints = at::zeros({4}, at::kLong);
  EXPECT_THROW(world_->all_reduce(ints, {ReduceOp::kAvg}), UsageError);

  at::Tensor out = at::zeros({10});
  EXPECT_THROW(world_->reduce_scatter(out, at::zeros({n * 10 + 1})), UsageError);
  EXPECT_THROW(world_->reduce_scatter(out, at::zeros({n * 10}, at::kDouble)), UsageError);
  at::Tensor gathered = at::zeros({n * 10 + 1});
  EXPECT_THROW(world_->all_gather(gathered, at::zeros({10})), UsageError);
  at::Tensor gathered_d = at::zeros({n * 10}, at::kDouble);
  EXPECT_THROW(world_->all_gather(gathered_d, at::zeros({10})), UsageError);
  if (n > 1) {  // an input overlapping the output, but not as this rank's chunk
    at::Tensor buffer = at::zeros({n * 10});
    at::Tensor wrong_chunk = buffer.narrow(0, rank() == 0 ? 1 : 0, 10);
    EXPECT_THROW(world_->all_gather(buffer, wrong_chunk), UsageError);
  }

  at::Tensor t = at::zeros({3});
  EXPECT_THROW(world_->broadcast(t, -1), UsageError);
  EXPECT_THROW(world_->broadcast(t, n), UsageError);
  EXPECT_THROW(world_->send(t, n, 0), UsageError);
  EXPECT_THROW(world_->recv(t, -1, 0), UsageError);
  EXPECT_THROW(world_->send(t, 0, -5), UsageError);
  EXPECT_THROW(world_->split(-1, 0, "bad"), UsageError);
  try {
    world_->reduce_scatter(out, at::zeros({n * 10 + 1}));
    ADD_FAILURE() << "no throw";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("reduce_scatter on group 'world'"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(n * 10 + 1)), std::string::npos) << message;
  }

  // Argument errors leave the group usable.
  at::Tensor ok = at::ones({2});
  world_->all_reduce(ok)->wait();
  EXPECT_TRUE(same_values(ok, at::full({2}, static_cast<double>(n))));
}

// Rank 0 of each pair calls all_reduce with a 500 ms timeout; rank 1 joins only after
// rank 0 has seen the CommError, so rank 0's abandoned request completes late and the
// communicator is destroyed without hanging or leaking.
TEST_F(CommTest, TimeoutMakesGroupUnusable) {
  if (size() < 2) GTEST_SKIP() << "needs a peer";
  const int pair = rank() / 2;
  const bool has_peer = pair * 2 + 1 < size();
  auto group = world_->split(has_peer ? pair : size(), rank(), "pair" + std::to_string(pair));
  at::Tensor first = at::full({1024}, rank() + 1.0);  // 4096 bytes
  at::Tensor second = at::full({16}, rank() + 1.0);
  group->set_step(7);  // as the engine does: errors name the training step
  if (has_peer && group->rank() == 0) {
    const auto start = Clock::now();
    auto timed = group->all_reduce(first, {ReduceOp::kSum, milliseconds(500)});
    auto behind = group->all_reduce(second);  // default timeout: fails with the group
    try {
      timed->wait();
      ADD_FAILURE() << "all_reduce without a peer did not time out";
    } catch (const CommError& e) {
      const std::string message = e.what();
      for (const std::string& part : {std::string("all_reduce"), "group 'pair" + std::to_string(pair) + "'",
                                      std::string("4096 bytes"), std::string("float32"), std::string("at step 7"),
                                      std::string("500 ms"), std::string("on rank 0"), std::string("unusable")}) {
        EXPECT_NE(message.find(part), std::string::npos) << part << " missing in: " << message;
      }
    }
    const auto waited = Clock::now() - start;
    // The per-call timeout applied, not the 30 s default (lower bound: time never runs
    // fast; the upper one leaves 25 s of slack for a loaded machine).
    EXPECT_GE(waited, milliseconds(450));
    EXPECT_LT(waited, milliseconds(25'000));
    EXPECT_THROW(behind->wait(), CommError);
    EXPECT_TRUE(timed->is_completed());
    // Later calls fail at submission: they throw before any Work exists to wait on.
    at::Tensor again = at::ones({4});
    EXPECT_THROW(group->all_reduce(again), CommError);
    EXPECT_THROW(group->barrier(), CommError);
    EXPECT_EQ(group->counters()[CommOp::kAllReduce].calls, 0);
  }
  world_->barrier()->wait();  // rank 1 of each pair joins only now
  if (has_peer && group->rank() == 1) {
    group->all_reduce(first)->wait();
    group->all_reduce(second)->wait();
    // Rank 0's abandoned requests still carried its data.
    EXPECT_TRUE(same_values(first, at::full({1024}, 2.0 * rank() + 1.0)));
    EXPECT_TRUE(same_values(second, at::full({16}, 2.0 * rank() + 1.0)));
  }
  group.reset();  // must return (the abandoned request completed); CTest's timeout guards a hang
  world_->barrier()->wait();
}

// The launcher's promise against the world MPI made (World refuses a mismatch). Mutant
// caught: trusting SLURM_NTASKS inside a batch script (no SLURM_STEP_ID), which would
// refuse every mpirun run in an allocation of another size.
TEST(LauncherSize, AWorldOfOneUnderSrunIsRefusedNamingTheFix) {
  auto env_of = [](std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  // srun without a PMI the MPI shares: four singletons.
  const std::string singletons =
      launcher_size_mismatch(1, env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "2"}}));
  EXPECT_NE(singletons.find("SLURM_NTASKS=4"), std::string::npos) << singletons;
  EXPECT_NE(singletons.find("srun --mpi=pmix"), std::string::npos) << singletons;
  // The step's own count wins over the allocation's.
  EXPECT_EQ(launcher_size_mismatch(2, env_of({{"SLURM_STEP_ID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"},
                                              {"SLURM_NTASKS", "8"}})),
            "");
  EXPECT_EQ(launcher_size_mismatch(4, env_of({{"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}})), "");
  // mpirun inside a batch script: the batch step's SLURM_NTASKS says nothing about it.
  EXPECT_EQ(launcher_size_mismatch(8, env_of({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}})), "");
  EXPECT_EQ(launcher_size_mismatch(8, env_of({{"OMPI_COMM_WORLD_SIZE", "8"}, {"SLURM_STEP_ID", "0"},
                                              {"SLURM_NTASKS", "2"}})),
            "");
  EXPECT_NE(launcher_size_mismatch(1, env_of({{"OMPI_COMM_WORLD_SIZE", "8"}})), "");
  EXPECT_EQ(launcher_size_mismatch(1, env_of({})), "");  // started by hand: a world of one
}

}  // namespace
}  // namespace parallax
