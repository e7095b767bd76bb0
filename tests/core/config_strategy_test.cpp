// The strategy sections of the config ([zero], [precision]'s loss scaling, [offload],
// [tensor_parallel]):
// every key read, and every value or combination outside what is allowed refused with
// a message naming the file position, the keys and why.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "config_test_support.h"
#include "parallax/core/config.h"
#include "parallax/core/config_loader.h"

namespace parallax {
namespace {

using namespace config_testing;

TEST_F(ConfigTest, ZeroSectionReadsEveryKey) {
  const Config config = load({write(
      "a.toml",
      "[zero]\nstage = 3\nbucket_mb = 4\noverlap_comm = false\nprefetch_mb = 8\npersistence_threshold = 100\n"
      "max_live_mb = 64\nreshard_after_forward = false\nwrap = [\"Block\", \"Embedding\"]\nwrap_min_params = 1000\n")});
  EXPECT_EQ(config.zero.stage, 3);
  EXPECT_EQ(config.zero.bucket_bytes(), 4 << 20);
  EXPECT_FALSE(config.zero.overlap_comm);
  EXPECT_EQ(config.zero.prefetch_bytes(), 8 << 20);
  EXPECT_EQ(config.zero.persistence_threshold, 100);
  EXPECT_EQ(config.zero.max_live_bytes(), 64 << 20);
  EXPECT_FALSE(config.zero.reshard_after_forward);
  EXPECT_EQ(config.zero.wrap, (std::vector<std::string>{"Block", "Embedding"}));
  EXPECT_EQ(config.zero.wrap_min_params, 1000);
  // to_toml writes what loads back.
  EXPECT_CONTAINS(to_toml(config), "wrap = [\"Block\", \"Embedding\"]");
}

TEST_F(ConfigTest, ZeroKeysOutsideTheirRangesNameKeyValueAndAllowed) {
  std::string path;
  EXPECT_CONTAINS(load_error("[zero]\nstage = 4\n", &path), "zero.stage = 4 at " + path + ":2:9: expected 0..3");
  EXPECT_CONTAINS(load_error("[zero]\nwrap = \"Block\"\n"), "zero.wrap = \"Block\"");
  EXPECT_CONTAINS(load_error("[zero]\nwrap = \"Block\"\n"), "expected an array of strings");
  EXPECT_CONTAINS(load_error("[zero]\nwrap = [\"\"]\n"), "expected an array of non-empty strings");
  EXPECT_CONTAINS(load_error("[zero]\nprefetch_mb = -1\n"), "expected MiB in [0, 1048576]");
  EXPECT_CONTAINS(load_error("[zero]\npersistence_threshold = -5\n"), "expected an integer >= 0");
  EXPECT_CONTAINS(load_error("[zero]\nreshard_after_forwrd = true\n"), "did you mean");
}

TEST_F(ConfigTest, LossScalingKeysAreCheckedTogether) {
  const Config config =
      load({write("a.toml",
                  "[precision]\ndtype = \"fp16\"\nloss_scale_initial = 1024\nloss_scale_growth_interval = 50\n"
                  "loss_scale_backoff = 0.25\nloss_scale_hysteresis = 3\nloss_scale_min = 2\n")});
  EXPECT_EQ(config.precision.loss_scale_initial, 1024);
  EXPECT_EQ(config.precision.loss_scale_growth_interval, 50);
  EXPECT_EQ(config.precision.loss_scale_backoff, 0.25);
  EXPECT_EQ(config.precision.loss_scale_hysteresis, 3);
  EXPECT_EQ(config.precision.loss_scale_min, 2);
  EXPECT_CONTAINS(load_error("[precision]\nloss_scale_backoff = 1.5\n"), "expected a number in (0, 1)");
  EXPECT_CONTAINS(load_error("[precision]\nloss_scale_initial = 4\nloss_scale_min = 8\n"),
                  "precision.loss_scale_min = 8.0 at ");
}

TEST_F(ConfigTest, OffloadSectionReadsEveryKey) {
  const Config config =
      load({write("a.toml",
                  "[zero]\nstage = 3\n[offload]\noptimizer = \"nvme\"\nparam = \"nvme\"\npin_memory = false\n"
                  "nvme_path = \"/local/nvme\"\nbuffer_mb = 16\nbuffer_count = 2\n")});
  EXPECT_EQ(config.offload.optimizer, OffloadTarget::kNvme);
  EXPECT_EQ(config.offload.param, OffloadTarget::kNvme);
  EXPECT_FALSE(config.offload.pin_memory);
  EXPECT_EQ(config.offload.nvme_path, "/local/nvme");
  EXPECT_EQ(config.offload.buffer_bytes(), 16 << 20);
  EXPECT_EQ(config.offload.buffer_count, 2);
  EXPECT_CONTAINS(to_toml(config), "[offload]\noptimizer = \"nvme\"\nparam = \"nvme\"");
}

TEST_F(ConfigTest, EveryInvalidOffloadCombinationSaysWhy) {
  std::string path;
  const std::string at_stage_0 = load_error("[offload]\noptimizer = \"cpu\"\n", &path);
  EXPECT_CONTAINS(at_stage_0, "offload.optimizer = \"cpu\" at " + path + ":2:13");
  EXPECT_CONTAINS(at_stage_0, "it needs zero.stage = 1, 2 or 3 (zero.stage = 0)");
  const std::string param_below_3 =
      load_error("[zero]\nstage = 2\n[offload]\noptimizer = \"cpu\"\nparam = \"cpu\"\n", &path);
  EXPECT_CONTAINS(param_below_3, "offload.param = \"cpu\" at " + path + ":5:9");
  EXPECT_CONTAINS(param_below_3, "only zero.stage = 3 shards the parameters");
  EXPECT_CONTAINS(param_below_3, "(zero.stage = 2 at " + path + ":2:9)");
  EXPECT_CONTAINS(load_error("[zero]\nstage = 3\n[offload]\nparam = \"cpu\"\n"),
                  "set offload.optimizer = \"cpu\" or \"nvme\" too");
  EXPECT_CONTAINS(load_error("[zero]\nstage = 3\n[offload]\noptimizer = \"cpu\"\nparam = \"nvme\"\n"
                             "nvme_path = \"/tmp\"\n"),
                  "set offload.optimizer = \"nvme\" too");
  const std::string no_path = load_error("[zero]\nstage = 1\n[offload]\noptimizer = \"nvme\"\n");
  EXPECT_CONTAINS(no_path, "offload.optimizer = \"nvme\" at ");
  EXPECT_CONTAINS(no_path, "needs offload.nvme_path");
  EXPECT_CONTAINS(load_error("[zero]\nstage = 1\n[offload]\noptimizer = \"cpu\"\nnvme_path = \"/tmp\"\n"),
                  "no NVMe tier is in use");
  EXPECT_CONTAINS(load_error("[zero]\nstage = 1\n[optimizer]\ntype = \"sgd\"\n[offload]\noptimizer = \"cpu\"\n"),
                  "optimizer.type = \"sgd\" at ");
  EXPECT_CONTAINS(load_error("[offload]\nbuffer_count = 1\n"), "offload.buffer_count = 1 at ");
  EXPECT_CONTAINS(load_error("[offload]\nbuffer_count = 1\n"), "expected an integer >= 2");
  EXPECT_CONTAINS(load_error("[offload]\noptimizer = \"disk\"\n"), "\"none\", \"cpu\", \"nvme\"");
  EXPECT_CONTAINS(load_error("[offload]\nnvme_pth = \"/tmp\"\n"), "did you mean");
}

TEST_F(ConfigTest, TensorParallelPlanReadsStringsAndTablesAndPrintsBack) {
  const Config config = load({write("a.toml",
                                    "[tensor_parallel]\nsequence_parallel = true\n[tensor_parallel.plan]\n"
                                    "\"blocks.*.qkv\" = { style = \"column\", parts = 3, heads = 4 }\n"
                                    "\"head\" = { style = \"vocab_output\", gather_output = true }\n"
                                    "\"blocks.*.proj\" = \"row\"\n")});
  EXPECT_TRUE(config.tensor_parallel.sequence_parallel);
  EXPECT_EQ(config.tensor_parallel.sequence_dim, -2);
  ASSERT_EQ(config.tensor_parallel.plan.size(), 3u);
  std::map<std::string, TpPlanRule> rules;
  for (const auto& rule : config.tensor_parallel.plan) rules[rule.pattern] = rule;
  EXPECT_EQ(rules["blocks.*.qkv"].style, TpStyle::kColumn);
  EXPECT_EQ(rules["blocks.*.qkv"].parts, 3);
  EXPECT_EQ(rules["blocks.*.qkv"].heads, 4);
  EXPECT_CONTAINS(rules["blocks.*.qkv"].position, "a.toml:4:");
  EXPECT_EQ(rules["head"].style, TpStyle::kVocabOutput);
  EXPECT_TRUE(rules["head"].gather_output);
  EXPECT_EQ(rules["blocks.*.proj"].style, TpStyle::kRow);
  // to_toml prints what loads back to the same plan.
  const Config again = load({write("b.toml", to_toml(config))});
  EXPECT_EQ(to_toml(again), to_toml(config));
  EXPECT_EQ(again.tensor_parallel.plan.size(), 3u);
}

TEST_F(ConfigTest, BadTensorParallelPlansSayWhy) {
  std::string path;
  const std::string typo = load_error("[tensor_parallel.plan]\n\"fc\" = \"colum\"\n", &path);
  EXPECT_CONTAINS(typo, "tensor_parallel.plan.\"fc\" = \"colum\" at " + path + ":2:8");
  EXPECT_CONTAINS(typo, "did you mean \"column\"?");
  EXPECT_CONTAINS(load_error("[tensor_parallel.plan]\n\"fc\" = { parts = 2 }\n"), "needs style = one of");
  EXPECT_CONTAINS(load_error("[tensor_parallel.plan]\n\"fc\" = { style = \"row\", parts = 2 }\n"),
                  "parts = 2 applies to style \"column\" only");
  EXPECT_CONTAINS(load_error("[tensor_parallel.plan]\n\"fc\" = { style = \"row\", gather_output = true }\n"),
                  "gather_output applies to styles \"column\" and \"vocab_output\" only");
  EXPECT_CONTAINS(load_error("[tensor_parallel.plan]\n\"fc\" = { style = \"column\", part = 3 }\n"),
                  "did you mean 'parts'?");
  EXPECT_CONTAINS(load_error("[tensor_parallel.plan]\n\"fc\" = { style = \"column\", parts = 0 }\n"),
                  "expected an integer >= 1");
  EXPECT_CONTAINS(load_error("[tensor_parallel]\nplan = 3\n"), "expected a table of module path globs");
  EXPECT_CONTAINS(
      load_error("[tensor_parallel.plan]\n\"qkv\" = { style = \"column\", parts = 3, gather_output = true }\n"),
      "gather_output with parts = 3 would interleave the fused blocks");
  EXPECT_CONTAINS(load_error("[tensor_parallel]\nsequence_dim = 1\n"), "a dimension counted from the end");
}

TEST_F(ConfigTest, PipelineSectionReadsEveryKeyAndWritesWhatLoadsBack) {
  const Config config = load({write("a.toml",
                                    "[parallel]\npp = 2\n[pipeline]\nschedule = \"interleaved\"\nvirtual_stages = 2\n"
                                    "partition = [0, 2, 3, 5, 8]\nrecompute = \"full\"\n")});
  EXPECT_EQ(config.pipeline.schedule, PipelineSchedule::kInterleaved);
  EXPECT_EQ(config.pipeline.virtual_stages, 2);
  EXPECT_EQ(config.pipeline.partition, PipelinePartition::kExplicit);
  EXPECT_EQ(config.pipeline.boundaries, (std::vector<std::int64_t>{0, 2, 3, 5, 8}));
  EXPECT_EQ(config.pipeline.recompute, Recompute::kFull);
  const std::string text = to_toml(config);
  EXPECT_CONTAINS(text, "partition = [0, 2, 3, 5, 8]");
  EXPECT_CONTAINS(text, "schedule = \"interleaved\"");
  const Config again = load({write("b.toml", text)});
  EXPECT_EQ(again.pipeline.boundaries, config.pipeline.boundaries);
  EXPECT_EQ(again.pipeline.schedule, config.pipeline.schedule);
  // The default writes a name, not a list.
  EXPECT_CONTAINS(to_toml(load({write("c.toml", "[pipeline]\npartition = \"profile\"\n")})), "partition = \"profile\"");
}

TEST_F(ConfigTest, PipelineErrorsNameKeyValueAndAllowed) {
  std::string path;
  const std::string typo = load_error("[pipeline]\nschedule = \"1f1c\"\n", &path);
  EXPECT_CONTAINS(typo, "pipeline.schedule = \"1f1c\" at " + path + ":2:12");
  EXPECT_CONTAINS(typo, "\"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\"");
  EXPECT_CONTAINS(typo, "did you mean \"1f1b\"?");
  EXPECT_CONTAINS(load_error("[pipeline]\npartition = \"layers\"\n"),
                  "one of \"uniform\", \"parameters\", \"profile\", or an array of integers");
  EXPECT_CONTAINS(load_error("[parallel]\npp = 2\n[pipeline]\nschedule = \"interleaved\"\n"),
                  "interleaving needs pipeline.virtual_stages > 1");
  EXPECT_CONTAINS(load_error("[pipeline]\nschedule = \"interleaved\"\nvirtual_stages = 2\n"),
                  "it needs parallel.pp > 1");
  EXPECT_CONTAINS(load_error("[parallel]\npp = 2\n[pipeline]\nvirtual_stages = 2\n"),
                  "only schedule = \"interleaved\" runs several chunks per rank");
  EXPECT_CONTAINS(load_error("[parallel]\npp = 2\n[pipeline]\npartition = [0, 4]\n"),
                  "a list of 3 boundaries expected");
  EXPECT_CONTAINS(load_error("[parallel]\npp = 2\n[pipeline]\npartition = [1, 3, 4]\n"),
                  "the first boundary must be 0");
  EXPECT_CONTAINS(load_error("[parallel]\npp = 2\n[pipeline]\npartition = [0, 4, 4]\n"), "boundaries must increase");
  EXPECT_CONTAINS(load_error("[pipeline]\npartition = [0, \"a\"]\n"), "or an array of integers");
}

}  // namespace
}  // namespace parallax
