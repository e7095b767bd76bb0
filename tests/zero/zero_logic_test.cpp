// ZeRO's pure parts with simulated ranks: shard arithmetic, bucket grouping, stage 3's
// gather/release schedule, and fp16 loss scaling.
#include <gtest/gtest.h>

#include <numeric>

#include "parallax/core/error.h"
#include "parallax/zero/gather_schedule.h"
#include "parallax/zero/loss_scaler.h"
#include "parallax/zero/shard_layout.h"

namespace parallax::zero {
namespace {

TEST(ShardLayout, PadsToAMultipleOfTheRanksAndCoversEveryElementOnce) {
  for (int ranks : {1, 2, 3, 4, 7}) {
    const std::vector<std::int64_t> numels{10, 3, 1, 25};
    const ShardLayout layout(numels, ranks);
    EXPECT_EQ(layout.numel(), 39);
    EXPECT_EQ(layout.padded_numel() % ranks, 0);
    EXPECT_LT(layout.padding(), ranks);
    EXPECT_EQ(layout.padded_numel(), layout.numel() + layout.padding());
    // Every element of every parameter is in exactly one shard, at the right place.
    for (std::size_t i = 0; i < numels.size(); ++i) {
      std::vector<int> owners(static_cast<std::size_t>(numels[i]), 0);
      for (int r = 0; r < ranks; ++r) {
        const auto fragment = layout.fragment(i, r);
        if (!fragment) continue;
        EXPECT_EQ(r * layout.shard_numel() + fragment->shard_offset, layout.offset(i) + fragment->param_offset);
        EXPECT_LE(fragment->shard_offset + fragment->numel, layout.shard_numel());
        for (std::int64_t e = 0; e < fragment->numel; ++e)
          ++owners[static_cast<std::size_t>(fragment->param_offset + e)];
      }
      for (int count : owners) EXPECT_EQ(count, 1) << "param " << i << " ranks " << ranks;
    }
  }
}

TEST(ShardLayout, AParameterStraddlesShardsAndSmallOnesMayMissARank) {
  const ShardLayout layout({10, 3}, 4);  // 13 → 16, S = 4
  EXPECT_EQ(layout.shard_numel(), 4);
  EXPECT_EQ(layout.padding(), 3);
  const auto a = layout.fragment(1, 2);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->param_offset, 0);
  EXPECT_EQ(a->shard_offset, 2);
  EXPECT_EQ(a->numel, 2);
  const auto b = layout.fragment(1, 3);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->param_offset, 2);
  EXPECT_EQ(b->numel, 1);
  EXPECT_FALSE(layout.fragment(1, 0));
  // More ranks than elements: most ranks own only padding.
  const ShardLayout tiny({2}, 8);
  EXPECT_EQ(tiny.shard_numel(), 1);
  EXPECT_TRUE(tiny.fragment(0, 1));
  EXPECT_FALSE(tiny.fragment(0, 2));
}

TEST(GroupByBytes, FillsInOrderAndGivesAnOversizedItemItsOwnGroup) {
  const auto groups = group_by_bytes({4, 4, 4, 20, 4, 4}, 10);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0], (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(groups[1], (std::vector<std::size_t>{2}));
  EXPECT_EQ(groups[2], (std::vector<std::size_t>{3}));
  EXPECT_EQ(groups[3], (std::vector<std::size_t>{4, 5}));
}

using Phase = GatherSchedule::Phase;
using Units = std::vector<std::size_t>;

TEST(GatherSchedule, ReleasesAfterUseWithinTheLiveBudgetKeepsTheLastUsedForBackwardAndGathersTheRestAgain) {
  // Units of 100, 100 and 50 bytes; at most 150 bytes live.
  GatherSchedule schedule({100, 100, 50}, /*prefetch=*/0, /*max_live=*/150, /*reshard=*/true);
  EXPECT_EQ(schedule.touch(0, Phase::kForward).gather, Units{0});
  const auto second = schedule.touch(1, Phase::kForward);
  EXPECT_EQ(second.gather, Units{1});
  EXPECT_EQ(second.release, Units{0});  // 100 + 100 > 150: the least recently used goes first
  const auto third = schedule.touch(2, Phase::kForward);
  EXPECT_EQ(third.gather, Units{2});
  EXPECT_EQ(third.release, Units{});                              // 150 fits
  EXPECT_EQ(schedule.touch(1, Phase::kForward).gather, Units{});  // still gathered
  // Unit 1, used last, is backward's first: kept (releasing it would gather it again at once).
  EXPECT_EQ(schedule.end_forward().release, Units{2});
  EXPECT_EQ(schedule.touch(1, Phase::kBackward).gather, Units{});
  EXPECT_EQ(schedule.backward_done(1).release, Units{1});
  EXPECT_EQ(schedule.touch(2, Phase::kBackward).gather, Units{2});
  EXPECT_EQ(schedule.backward_done(2).release, Units{2});
  EXPECT_EQ(schedule.backward_done(0).release, Units{});  // its backward needed no parameter
  EXPECT_EQ(schedule.live_bytes(), 0);
  EXPECT_EQ(schedule.peak_live_bytes(), 150);  // never above the budget when units fit in it
}

// reshard_after_forward = reshard_after_backward = false: a pipeline's micro-batches
// (forward, backward, forward, ...) gather each unit once; end_step releases them all.
TEST(GatherSchedule, HeldUntilTheStepEachUnitIsGatheredOncePerStep) {
  GatherSchedule schedule({100, 50}, /*prefetch=*/0, /*max_live=*/0, /*reshard_after_forward=*/false,
                          /*reshard_after_backward=*/false);
  std::size_t gathers = 0;
  for (int micro = 0; micro < 4; ++micro) {
    gathers += schedule.touch(0, Phase::kForward).gather.size();
    gathers += schedule.touch(1, Phase::kForward).gather.size();
    EXPECT_EQ(schedule.end_forward().release, Units{});
    gathers += schedule.touch(1, Phase::kBackward).gather.size();
    EXPECT_EQ(schedule.backward_done(1).release, Units{});
    gathers += schedule.touch(0, Phase::kBackward).gather.size();
    EXPECT_EQ(schedule.backward_done(0).release, Units{});
    EXPECT_EQ(schedule.end_backward().release, Units{});
  }
  EXPECT_EQ(gathers, 2u);
  EXPECT_EQ(schedule.live_bytes(), 150);
  EXPECT_EQ(schedule.end_step().release, (Units{0, 1}));
  EXPECT_EQ(schedule.live_bytes(), 0);
  EXPECT_EQ(schedule.touch(0, Phase::kForward).gather, Units{0});  // the next step gathers afresh
}

TEST(GatherSchedule, WithNoBudgetOnlyTheUnitInUseIsGathered) {
  GatherSchedule schedule({100, 300, 200}, 0, /*max_live=*/0, /*reshard=*/true);
  for (std::size_t u : {0u, 1u, 2u, 0u}) {
    schedule.touch(u, Phase::kForward);
    EXPECT_EQ(schedule.live_bytes(), std::vector<std::int64_t>({100, 300, 200})[u]);
  }
  EXPECT_EQ(schedule.peak_live_bytes(), 300);  // the largest unit
}

TEST(GatherSchedule, PrefetchesAlongTheRecordedOrderWithinItsBudget) {
  GatherSchedule schedule({100, 100, 100, 100}, /*prefetch=*/200, /*max_live=*/1 << 20, /*reshard=*/true);
  // First pass: nothing recorded, nothing prefetched.
  for (std::size_t u : {3u, 1u, 0u, 2u}) EXPECT_EQ(schedule.touch(u, Phase::kForward).gather, Units{u});
  schedule.end_forward();
  schedule.end_backward();
  EXPECT_EQ(schedule.recorded_order(Phase::kForward), (Units{3, 1, 0, 2}));
  // Second pass: touching 3 gathers it and prefetches the next two in recorded order.
  EXPECT_EQ(schedule.touch(3, Phase::kForward).gather, (Units{3, 1, 0}));
  EXPECT_EQ(schedule.touch(1, Phase::kForward).gather, (Units{2}));
  EXPECT_EQ(schedule.order_changes(), 0);
  // A different order is recorded again.
  schedule.touch(2, Phase::kForward);
  schedule.touch(0, Phase::kForward);
  schedule.end_forward();
  EXPECT_EQ(schedule.order_changes(), 1);
  EXPECT_EQ(schedule.recorded_order(Phase::kForward), (Units{3, 1, 2, 0}));
}

// A prefetched unit is used without a gather; its use must still release what the
// forward used before it, or with prefetch on nothing is ever released in the forward
// (a 69M GPT's ZeRO-3 step held every block gathered: 27 MiB each).
// Mutant caught: eviction only when the touched unit had to be gathered.
TEST(GatherSchedule, APrefetchedUnitsUseReleasesTheUnitsUsedBeforeIt) {
  GatherSchedule schedule({100, 100, 100, 100}, /*prefetch=*/100, /*max_live=*/0, /*reshard=*/true);
  for (std::size_t u : {0u, 1u, 2u, 3u}) schedule.touch(u, Phase::kForward);  // records the order
  schedule.end_forward();
  schedule.end_backward();
  schedule.end_step();
  EXPECT_EQ(schedule.touch(0, Phase::kForward).gather, (Units{0, 1}));  // 1 prefetched
  for (std::size_t u : {1u, 2u, 3u}) {
    const auto actions = schedule.touch(u, Phase::kForward);
    EXPECT_EQ(actions.release, Units{u - 1}) << "unit " << u;
    EXPECT_LE(schedule.live_bytes(), 200) << "unit " << u;  // the one in use and the one prefetched
  }
  EXPECT_LE(schedule.peak_live_bytes(), 200);
}

// An operator that reads two units' parameters (a shared weight beside a block's) needs
// both while it runs: touched together, neither is released to make room for the other.
// Mutants caught: one touch per unit, and nested operators releasing (under max_live 0
// the second released the first, and the operator read a released parameter: "its data
// is not allocated"; parameter_groups_test's stage 3 met both, a Linear's weight and bias
// being units of their own optimizer groups).
TEST(GatherSchedule, TheUnitsOneOperatorReadsAreAllKept) {
  GatherSchedule schedule({100, 100, 100}, /*prefetch=*/0, /*max_live=*/0, /*reshard=*/true);
  schedule.touch(0, Phase::kForward);
  const auto both = schedule.touch(Units{1, 2}, Phase::kForward);
  EXPECT_EQ(both.gather, (Units{1, 2}));
  EXPECT_EQ(both.release, Units{0});
  EXPECT_TRUE(schedule.gathered(1) && schedule.gathered(2));
  EXPECT_EQ(schedule.touch(Units{2, 1}, Phase::kForward).release, Units{});
  // An operator inside the one that read both (addmm expanding its bias) reads one of
  // them only: the other stays, as the outer operator still reads it.
  EXPECT_EQ(schedule.touch(Units{2}, Phase::kForward, /*may_release=*/false).release, Units{});
  EXPECT_TRUE(schedule.gathered(1));
}

TEST(GatherSchedule, KeepsUnitsUntilBackwardWithoutResharding) {
  GatherSchedule schedule({100, 100}, 0, /*max_live=*/0, /*reshard=*/false);  // budget ignored
  schedule.touch(0, Phase::kForward);
  EXPECT_EQ(schedule.touch(1, Phase::kForward).release, Units{});
  EXPECT_EQ(schedule.end_forward().release, Units{});
  EXPECT_EQ(schedule.touch(1, Phase::kBackward).gather, Units{});  // still gathered
  EXPECT_EQ(schedule.backward_done(1).release, Units{1});
  EXPECT_EQ(schedule.end_backward().release, Units{0});
}

TEST(LossScaler, BacksOffAfterTheHysteresisGrowsAfterTheIntervalAndFailsAtTheMinimum) {
  LossScaler scaler(LossScalerOptions(1024).growth_interval(3).hysteresis(2).backoff(0.5).min_scale(256));
  EXPECT_TRUE(scaler.update(true));  // first overflow: skipped, hysteresis consumed
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_TRUE(scaler.update(true));  // second: backs off
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_TRUE(scaler.update(true));  // hysteresis spent: backs off at once
  EXPECT_EQ(scaler.scale(), 256);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 512);  // grew after 3 good steps, hysteresis restored
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 256);
  EXPECT_EQ(scaler.skipped_steps(), 5);
  EXPECT_THROW(scaler.update(true), UsageError);  // 128 < minimum 256
}

TEST(LossScaler, RejectsOptionsOutsideTheirRanges) {
  EXPECT_THROW(LossScaler(LossScalerOptions(0)), ConfigError);
  EXPECT_THROW(LossScaler(LossScalerOptions(8).min_scale(16)), ConfigError);
  EXPECT_THROW(LossScaler(LossScalerOptions(8).backoff(1.0)), ConfigError);
}

}  // namespace
}  // namespace parallax::zero
