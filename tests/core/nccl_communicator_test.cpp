// Tests of the NCCL communicator (label "gpu"). One process: a world of one, bootstrapped
// through the MPI world communicator (Open MPI singleton). Without a CUDA device it checks
// that construction fails with the clear CommError, then skips.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "parallax/core/error.h"
#include "parallax/core/nccl_communicator.h"
#include "parallax/core/world.h"

namespace parallax {
namespace {

// MPI comes up once for the whole binary (gtest_main owns main()).
class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    static char program[] = "nccl_communicator_test";
    static char* args[] = {program, nullptr};
    int argc = 1;
    char** argv = args;
    world_ = std::make_unique<World>(argc, argv);
  }
  void TearDown() override { world_.reset(); }
  static World& world() { return *world_; }

 private:
  static inline std::unique_ptr<World> world_;
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

bool cuda_device_visible() {
  int count = 0;
  const bool visible = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return visible;
}

// Skips the test unless collectives can run: a GPU and a LibTorch with CUDA.
#define REQUIRE_CUDA_TENSORS()                                             \
  do {                                                                     \
    if (!cuda_device_visible()) GTEST_SKIP() << "no CUDA device visible";  \
    if (!at::hasCUDA()) GTEST_SKIP() << "LibTorch was built without CUDA"; \
  } while (false)

TEST(NcclCommunicator, WithoutGpuConstructionFailsClearly) {
  if (cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible";
  std::string message;
  try {
    create_nccl_communicator(MpiEnvironment::world().communicator(), 0, "world");
    FAIL() << "create_nccl_communicator succeeded without a GPU";
  } catch (const CommError& e) {
    message = e.what();
    EXPECT_NE(message.find("no CUDA device visible"), std::string::npos) << message;
    EXPECT_NE(message.find("'world'"), std::string::npos) << message;
  }
  // The bootstrap communicator is still usable afterwards.
  at::Tensor t = at::ones({2});
  MpiEnvironment::world().communicator().all_reduce(t)->wait();
  EXPECT_EQ(t[0].item<float>(), 1.0f);
}

TEST(NcclCommunicator, CollectivesOnOneRank) {
  REQUIRE_CUDA_TENSORS();
  auto comm = create_nccl_communicator(MpiEnvironment::world().communicator(), 0, "world");
  EXPECT_STREQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);

  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
    at::Tensor t = at::arange(100, cuda.dtype(at::kDouble)).to(dtype);
    comm->all_reduce(t)->wait();
    EXPECT_TRUE(at::equal(t.cpu().to(at::kDouble), at::arange(100, at::kDouble)));
  }
  at::Tensor avg = at::full({10}, 3.0, cuda);
  comm->all_reduce(avg, {ReduceOp::kAvg})->wait();
  EXPECT_EQ(avg.sum().item<double>(), 30.0);

  at::Tensor input = at::arange(8, cuda.dtype(at::kFloat));
  at::Tensor output = at::zeros({8}, cuda.dtype(at::kFloat));
  comm->reduce_scatter(output, input)->wait();
  EXPECT_TRUE(at::equal(output.cpu(), input.cpu()));
  at::Tensor gathered = at::zeros({8}, cuda.dtype(at::kFloat));
  comm->all_gather(gathered, input)->wait();
  EXPECT_TRUE(at::equal(gathered.cpu(), input.cpu()));
  comm->broadcast(gathered, 0)->wait();
  comm->barrier()->wait();

  // Several in flight, waited out of order.
  std::vector<at::Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 8; ++i) {
    tensors.push_back(at::full({1 << 16}, static_cast<double>(i), cuda));
    works.push_back(comm->all_reduce(tensors.back()));
  }
  for (int i = 7; i >= 0; --i) works[i]->wait();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tensors[i][0].item<double>(), i);

  const CommCounters counters = comm->counters();
  EXPECT_EQ(counters[CommOp::kAllReduce].calls, 4 + 1 + 8);
  EXPECT_EQ(counters[CommOp::kReduceScatter].bytes, 32);
  EXPECT_EQ(counters[CommOp::kAllGather].bytes, 32);
  EXPECT_EQ(counters[CommOp::kBarrier].calls, 1);

  auto child = comm->split(0, 0, "child");
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->name(), "child");
  at::Tensor c = at::ones({4}, cuda);
  child->all_reduce(c)->wait();
  EXPECT_EQ(c.sum().item<double>(), 4.0);
}

TEST(NcclCommunicator, BadArgumentsThrow) {
  REQUIRE_CUDA_TENSORS();
  auto comm = create_nccl_communicator(MpiEnvironment::world().communicator(), 0, "world");
  at::Tensor host = at::ones({4});
  EXPECT_THROW(comm->all_reduce(host), UsageError);
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor strided = at::zeros({4, 6}, cuda).t();
  EXPECT_THROW(comm->all_reduce(strided), UsageError);
  at::Tensor ints = at::zeros({4}, cuda.dtype(at::kLong));
  EXPECT_THROW(comm->all_reduce(ints, {ReduceOp::kAvg}), UsageError);
  at::Tensor out = at::zeros({3}, cuda);
  EXPECT_THROW(comm->reduce_scatter(out, at::zeros({4}, cuda)), UsageError);
  EXPECT_THROW(comm->broadcast(out, 1), UsageError);
  EXPECT_THROW(comm->send(out, 1, 0), UsageError);
}

}  // namespace
}  // namespace parallax
