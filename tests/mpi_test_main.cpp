// gtest main for tests launched with mpirun: every rank runs every test; the process
// exits non-zero when any of its tests failed, so mpirun (and CTest) report failure.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "parallax/core/world.h"

namespace {

// Ranks other than 0 print only their failures, each naming the rank and the test, so a
// failure on one rank is as legible in a CI log as rank 0's.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}

  // gtest holds its own lock while it reports a result, so the test is noted at its start.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED in %s\n%s:%d: %s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  parallax::World world(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world.rank()));
  }
  return RUN_ALL_TESTS();
}
