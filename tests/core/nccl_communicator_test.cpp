// placeholder, filled below
#include <gtest/gtest.h>
TEST(NcclCommunicator, Placeholder) { GTEST_SKIP(); }
