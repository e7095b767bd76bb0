// The schedules, checked as a whole: every stage's list run together in the simulator.
#include <gtest/gtest.h>

#include <cmath>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"
#include "parallax/pipeline/partition.h"
#include "parallax/pipeline/schedule.h"

namespace {

using parallax::PipelineSchedule;
using parallax::pipeline::check_schedules;
using parallax::pipeline::Instruction;
using parallax::pipeline::make_schedule;
using parallax::pipeline::Op;
using parallax::pipeline::ScheduleShape;
using parallax::pipeline::Simulation;

// The whole range: stages <= 8, micro-batches <= 32, virtual stages <= 4 where
// the schedule allows them. check_schedules throws on any violation (order, matching,
// deadlock, activation bound).
TEST(Schedules, EveryShapeIsSoundUpToEightStages) {
  int shapes = 0;
  for (PipelineSchedule kind :
       {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved, PipelineSchedule::kZbH1}) {
    for (int stages = 1; stages <= 8; ++stages) {
      for (int micro = 1; micro <= 32; ++micro) {
        const bool interleaved = kind == PipelineSchedule::kInterleaved;
        for (int chunks = interleaved ? 2 : 1; chunks <= (interleaved ? 4 : 1); ++chunks) {
          if (interleaved && stages == 1) continue;
          const ScheduleShape shape{kind, stages, micro, chunks};
          Simulation sim;
          ASSERT_NO_THROW(sim = check_schedules(shape))
              << parallax::to_string(kind) << " stages " << stages << " micro " << micro << " chunks " << chunks;
          for (int s = 0; s < stages; ++s) {
            ASSERT_LE(sim.peak_activations[s], parallax::pipeline::activation_bound(shape, s));
          }
          ++shapes;
        }
      }
    }
  }
  EXPECT_EQ(shapes, 3 * 8 * 32 + 7 * 32 * 3);
}

// 1F1B holds at most stages - stage micro-batches, and reaches that bound.
TEST(Schedules, OneFOneBMemoryBoundIsTight) {
  const ScheduleShape shape{PipelineSchedule::k1F1B, 4, 8, 1};
  const Simulation sim = check_schedules(shape);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(sim.peak_activations[s], 4 - s);
  // GPipe holds all of them.
  const Simulation gpipe = check_schedules({PipelineSchedule::kGPipe, 4, 8, 1});
  for (int s = 0; s < 4; ++s) EXPECT_EQ(gpipe.peak_activations[s], 8);
}

// Under unit costs (forward 1, backward 2) GPipe and 1F1B have the textbook bubble
// (p−1)/(m+p−1) on every stage; interleaving with v chunks and zb-h1 have less.
TEST(Schedules, BubblesMatchTheTheory) {
  for (int p : {2, 4, 8}) {
    for (int m : {1, 2, 4, 8, 16}) {
      const double ideal = static_cast<double>(p - 1) / (m + p - 1);
      for (PipelineSchedule kind : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
        const Simulation sim = check_schedules({kind, p, m, 1});
        for (int s = 0; s < p; ++s) EXPECT_NEAR(sim.bubble_fraction(s), ideal, 1e-12) << p << " " << m;
      }
      const Simulation zb = check_schedules({PipelineSchedule::kZbH1, p, m, 1});
      const Simulation interleaved = check_schedules({PipelineSchedule::kInterleaved, p, m, 2});
      for (int s = 0; s < p; ++s) {
        EXPECT_LE(zb.bubble_fraction(s), ideal + 1e-12);
        if (m >= p) {
          EXPECT_LT(interleaved.bubble_fraction(s), ideal) << p << " " << m;
        }
      }
      // zb-h1's makespan is shorter than 1F1B's by the weight gradients moved into bubbles.
      EXPECT_LT(zb.makespan, check_schedules({PipelineSchedule::k1F1B, p, m, 1}).makespan);
    }
  }
}

TEST(Schedules, OneFOneBListIsTheTextbookOrder) {
  // Stage 1 of 2 with 3 micro-batches: F0 B0 F1 B1 F2 B2 (the last stage never waits).
  const std::vector<Instruction> list = make_schedule({PipelineSchedule::k1F1B, 2, 3, 1}, 1);
  std::string ops;
  for (const Instruction& in : list) {
    if (in.op == Op::kForward) ops += "F" + std::to_string(in.micro_batch);
    if (in.op == Op::kBackward) ops += "B" + std::to_string(in.micro_batch);
  }
  EXPECT_EQ(ops, "F0B0F1B1F2B2");
  EXPECT_EQ(list.front().op, Op::kRecvActivation);
  EXPECT_EQ(list.back().op, Op::kOptimizerStep);
}

TEST(Schedules, FewerMicroBatchesThanStagesIsJustABiggerBubble) {
  for (PipelineSchedule kind : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B, PipelineSchedule::kZbH1}) {
    const Simulation sim = check_schedules({kind, 8, 2, 1});
    EXPECT_GT(sim.bubble_fraction(0), 0.6);
  }
  EXPECT_NO_THROW(check_schedules({PipelineSchedule::kInterleaved, 8, 3, 4}));
}

TEST(Schedules, BadShapesAreConfigErrors) {
  EXPECT_THROW(make_schedule({PipelineSchedule::kInterleaved, 4, 8, 1}, 0), parallax::ConfigError);
  EXPECT_THROW(make_schedule({PipelineSchedule::k1F1B, 4, 8, 2}, 0), parallax::ConfigError);
  EXPECT_THROW(make_schedule({PipelineSchedule::k1F1B, 4, 0, 1}, 0), parallax::ConfigError);
  EXPECT_THROW(make_schedule({PipelineSchedule::k1F1B, 4, 8, 1}, 4), parallax::UsageError);
}

// The checker catches a broken list: swapping two receives breaks the send order.
TEST(Schedules, CheckerRejectsAReorderedList) {
  const ScheduleShape shape{PipelineSchedule::k1F1B, 2, 4, 1};
  std::vector<std::vector<Instruction>> lists{make_schedule(shape, 0), make_schedule(shape, 1)};
  std::vector<std::size_t> receives;
  for (std::size_t i = 0; i < lists[1].size(); ++i) {
    if (lists[1][i].op == Op::kRecvActivation) receives.push_back(i);
  }
  std::swap(lists[1][receives[0]].micro_batch, lists[1][receives[1]].micro_batch);
  EXPECT_THROW(parallax::pipeline::simulate(shape, lists, std::vector<parallax::pipeline::StageCosts>(2)),
               parallax::InternalError);
  // A list that waits for a gradient before sending its activation deadlocks.
  lists = {make_schedule(shape, 0), make_schedule(shape, 1)};
  lists[1].insert(lists[1].begin(), Instruction{Op::kRecvGradient, 0, 0, 0});
  EXPECT_THROW(parallax::pipeline::simulate(shape, lists, std::vector<parallax::pipeline::StageCosts>(2)),
               parallax::InternalError);
}

TEST(Partition, UniformAndBalanced) {
  EXPECT_EQ(parallax::pipeline::uniform_boundaries(10, 4), (std::vector<std::int64_t>{0, 3, 6, 8, 10}));
  EXPECT_EQ(parallax::pipeline::balanced_boundaries({1, 4, 4, 4, 4, 2}, 3), (std::vector<std::int64_t>{0, 2, 4, 6}));
  // A heavy embedding and head: they get parts of their own.
  EXPECT_EQ(parallax::pipeline::balanced_boundaries({10, 1, 1, 1, 1, 10}, 3), (std::vector<std::int64_t>{0, 1, 5, 6}));
  EXPECT_THROW(parallax::pipeline::uniform_boundaries(3, 4), parallax::UsageError);
  EXPECT_EQ(parallax::pipeline::describe_boundaries({0, 1, 3}, {1, 1, 2}), "[0, 1) 25.0% [1, 3) 75.0%");
}

}  // namespace
