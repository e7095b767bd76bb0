// The NCCL communicator on several ranks (label gpu, RANKS 2 4): every collective with
// data that differs per rank, checked exactly, a ring of sends and receives, a split,
// and the routed world (CUDA tensors over NCCL, host ones over MPI) in one sequence.
// Skips, saying why, unless every rank of the node has a GPU of its own: NCCL refuses
// two ranks on one GPU, so a one-GPU machine cannot run it either.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "parallax/core/device_routed_communicator.h"
#include "parallax/core/mpi_communicator.h"
#include "parallax/core/nccl_communicator.h"

namespace parallax {
namespace {

int local_rank_and_size(int* size) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, size);
  MPI_Comm_free(&node);
  return rank;
}

class NcclRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    int local_size = 1;
    local_ = local_rank_and_size(&local_size);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
    cudaGetLastError();
    // Every rank decides the same way (a skip on one rank only would leave the others
    // waiting in NCCL's setup).
    int usable = devices >= local_size && at::hasCUDA() ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (usable == 0) {
      GTEST_SKIP() << "needs a CUDA device per rank on this node (" << local_size << "); " << devices << " visible"
                   << (at::hasCUDA() ? "" : ", and a LibTorch with CUDA");
    }
    mpi_ = create_mpi_world_communicator();
    nccl_ = create_nccl_communicator(*mpi_, local_, "world");
    cuda_ = at::TensorOptions().device(at::kCUDA, local_);
  }

  int local_ = 0;
  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<Communicator> nccl_;
  at::TensorOptions cuda_;
};

// Rank r contributes (r + 1) * [0, 1, ..., n-1]: the sum is n(n+1)/2 times that.
TEST_F(NcclRanks, CollectivesReduceEachRanksOwnData) {
  const int n = nccl_->size();
  const int r = nccl_->rank();
  const double ranks_sum = n * (n + 1) / 2.0;
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
    at::Tensor t = at::arange(64, cuda_.dtype(at::kDouble)).mul(r + 1).to(dtype);
    nccl_->all_reduce(t)->wait();
    EXPECT_TRUE(at::equal(t.cpu().to(at::kDouble), at::arange(64, at::kDouble).mul(ranks_sum))) << dtype;
  }
  at::Tensor average = at::full({8}, static_cast<double>(r), cuda_);
  nccl_->all_reduce(average, {ReduceOp::kAvg})->wait();
  EXPECT_DOUBLE_EQ(average[0].item<double>(), (n - 1) / 2.0);
  at::Tensor largest = at::full({8}, static_cast<double>(r), cuda_);
  nccl_->all_reduce(largest, {ReduceOp::kMax})->wait();
  EXPECT_DOUBLE_EQ(largest[7].item<double>(), n - 1);

  // reduce_scatter: chunk c of rank r holds (r + 1) * c; this rank receives the sum of chunk r.
  const std::int64_t chunk = 5;
  at::Tensor input = at::arange(n, cuda_.dtype(at::kFloat)).mul(r + 1).repeat_interleave(chunk);
  at::Tensor output = at::zeros({chunk}, cuda_.dtype(at::kFloat));
  nccl_->reduce_scatter(output, input)->wait();
  EXPECT_TRUE(at::equal(output.cpu(), at::full({chunk}, static_cast<float>(r * ranks_sum))));

  // all_gather: rank r's part is r everywhere.
  at::Tensor mine = at::full({chunk}, static_cast<float>(r), cuda_);
  at::Tensor gathered = at::zeros({n * chunk}, cuda_);
  nccl_->all_gather(gathered, mine)->wait();
  EXPECT_TRUE(at::equal(gathered.cpu(), at::arange(n, at::kFloat).repeat_interleave(chunk)));

  // broadcast from the last rank.
  at::Tensor message = at::full({4}, static_cast<float>(r), cuda_);
  nccl_->broadcast(message, n - 1)->wait();
  EXPECT_EQ(message.sum().item<float>(), 4.0f * (n - 1));

  const CommCounters counters = nccl_->counters();
  EXPECT_EQ(counters[CommOp::kAllReduce].calls, 4 + 2);
  EXPECT_EQ(counters[CommOp::kReduceScatter].bytes, n * chunk * 4);
  EXPECT_EQ(counters[CommOp::kAllGather].bytes, n * chunk * 4);
}

// Each rank sends its rank to the next and receives the previous one's: started before
// either is waited on (NCCL pairs them; waiting on the send first would deadlock a
// blocking implementation).
TEST_F(NcclRanks, ARingOfSendsAndReceivesDeliversEachRanksTensor) {
  const int n = nccl_->size();
  const int r = nccl_->rank();
  const at::Tensor outgoing = at::full({1000}, static_cast<float>(r), cuda_);
  at::Tensor incoming = at::zeros({1000}, cuda_);
  WorkPtr sent;
  WorkPtr received;
  if (r % 2 == 0) {  // even ranks send first, odd ranks receive first: one NCCL stream each
    sent = nccl_->send(outgoing, (r + 1) % n, 7);
    received = nccl_->recv(incoming, (r + n - 1) % n, 7);
  } else {
    received = nccl_->recv(incoming, (r + n - 1) % n, 7);
    sent = nccl_->send(outgoing, (r + 1) % n, 7);
  }
  received->wait();
  sent->wait();
  EXPECT_EQ(incoming.sum().item<float>(), 1000.0f * ((r + n - 1) % n));
}

// A split group reduces over its own ranks only; the routed world sends host tensors to
// MPI and CUDA ones to NCCL in one sequence, each with the right sum.
TEST_F(NcclRanks, SplitGroupsAndTheRoutedWorldReduceOverTheirOwnRanks) {
  const int n = nccl_->size();
  const int r = nccl_->rank();
  auto halves = nccl_->split(r % 2, r, "halves");
  at::Tensor t = at::full({3}, static_cast<double>(r), cuda_);
  halves->all_reduce(t)->wait();
  double want = 0;
  for (int q = r % 2; q < n; q += 2) want += q;
  EXPECT_DOUBLE_EQ(t[0].item<double>(), want);

  auto world = route_by_device(create_mpi_world_communicator(), create_nccl_communicator(*mpi_, local_, "routed"));
  at::Tensor on_device = at::full({3}, static_cast<double>(r), cuda_);
  at::Tensor on_host = at::full({3}, static_cast<double>(r + 1), at::kDouble);
  WorkPtr device_work = world->all_reduce(on_device);
  WorkPtr host_work = world->all_reduce(on_host);
  device_work->wait();
  host_work->wait();
  EXPECT_DOUBLE_EQ(on_device[0].item<double>(), n * (n - 1) / 2.0);
  EXPECT_DOUBLE_EQ(on_host[0].item<double>(), n * (n + 1) / 2.0);
  EXPECT_EQ(world->counters()[CommOp::kAllReduce].calls, 2);
}

}  // namespace
}  // namespace parallax
