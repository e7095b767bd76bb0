// gtest main for tests launched with mpirun: every rank runs every test; the process
// exits non-zero when any of its tests failed, so mpirun (and CTest) report failure.
#include <gtest/gtest.h>

#include "parallax/core/world.h"

int main(int argc, char** argv) {
  parallax::World world(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {
    // Keep failures from every rank, but only rank 0's progress lines.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ::testing::EmptyTestEventListener);
  }
  return RUN_ALL_TESTS();
}
