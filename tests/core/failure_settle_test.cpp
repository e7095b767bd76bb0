// When another rank's failure is heard, what this rank had already submitted settles
// before the group fails (mpi_progress.h, protocol step d): the rank that failed may have
// completed a collective that this rank, slower, is still completing. CI met the race
// (bad_launch_test): the tensor-parallel plan's agreement all_reduce completed on rank 1,
// which reported its ConfigError at once; rank 3, still inside the same all_reduce,
// abandoned it on hearing, so it reported rank 1's failure instead of its own.
//
// Run on 2 ranks, with the failure channel started as parallax::init starts it.
// Mutant caught: hearing a failure fails the group's in-flight operations at once (the
// settled all_reduce then throws "was abandoned").
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>

#include "parallax/core/communicator.h"
#include "parallax/core/error.h"
#include "parallax/core/failure_watch.h"
#include "parallax/core/mpi_communicator.h"

namespace parallax {
namespace {

using std::chrono::milliseconds;

TEST(FailureSettle, WhatWasSubmittedCompletesWhatNeverCanIsAbandonedAndLaterSubmitsThrow) {
  auto world = create_mpi_world_communicator();
  ASSERT_EQ(world->size(), 2) << "run on 2 ranks";
  failure_watch::start();
  // Long enough that an abandonment by timeout would be a different message.
  world->set_default_timeout(milliseconds(60'000));
  const int submitted_tag = 77;  // rank 1 -> 0: both all_reduces are submitted
  const int heard_tag = 78;       // rank 1 -> 0: the failure was heard
  at::Tensor joined = at::full({256}, world->rank() + 1.0);
  if (world->rank() == 0) {
    // Fails first, as rank 1 of the CI run did, but only once rank 1 has submitted (under
    // load its failure channel could otherwise hear it before the submits, which then are
    // refused: a different case). Joins the collective late: only after rank 1 has heard
    // of the failure while its all_reduce waited.
    int token = 0;
    MPI_Recv(&token, 1, MPI_INT, 1, submitted_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    failure_watch::announce_failure("an error of its own (failure_settle_test)");
    MPI_Recv(&token, 1, MPI_INT, 1, heard_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    world->all_reduce(joined)->wait();
    EXPECT_TRUE(at::equal(joined, at::full({256}, 3.0)));
  } else {
    // Rank 0 waits for both tokens whatever happens here, so a failed expectation is
    // reported rather than left as a hang.
    int token = 1;
    WorkPtr settles;
    WorkPtr never;
    at::Tensor lone = at::ones({4});
    EXPECT_NO_THROW({
      settles = world->all_reduce(joined);
      never = world->all_reduce(lone);  // rank 0 never joins this one
    });
    MPI_Send(&token, 1, MPI_INT, 0, submitted_tag, MPI_COMM_WORLD);
    // Heard, bounded: the failure channel delivers within its poll period.
    for (int polls = 0; polls < 10'000 && !failure_watch::job_failed(); ++polls) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    EXPECT_TRUE(failure_watch::job_failed()) << "rank 0's failure was never heard";
    // Submitted after the failure was heard: refused at once, naming the failure.
    at::Tensor late = at::ones({4});
    try {
      world->all_reduce(late);
      ADD_FAILURE() << "an all_reduce submitted after the failure was heard was accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 failed: an error of its own (failure_settle_test)"), std::string::npos) << e.what();
    }
    MPI_Send(&token, 1, MPI_INT, 0, heard_tag, MPI_COMM_WORLD);
    ASSERT_TRUE(settles && never) << "the all_reduces were refused before the failure was announced";
    EXPECT_NO_THROW(settles->wait());
    EXPECT_TRUE(at::equal(joined, at::full({256}, 3.0)));
    try {
      never->wait();
      ADD_FAILURE() << "an all_reduce rank 0 never joined completed";
    } catch (const CommError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("was abandoned: rank 0 failed: an error of its own"), std::string::npos) << message;
    }
  }
}

}  // namespace
}  // namespace parallax
