// [engine.<name>] tables: one engine's zero, offload, precision and grad_accum over the
// run's, read and checked as strictly as the run's sections, printed and hashed with them.
#include <gtest/gtest.h>

#include "config_test_support.h"

namespace parallax {
namespace {

using namespace config_testing;

class EngineTables : public ConfigTest {
 protected:
  Config load_engines(const std::string& text, const std::vector<std::string>& sets = {}) {
    path_ = write("gan.toml", text);
    return load_config(ConfigSources{{path_}, sets}, LoadOptions{{}, {"generator", "discriminator"}});
  }
  std::string error_loading(const std::string& text) {
    return error_of([&] { load_engines(text); });
  }
  std::string path_;
};

TEST_F(EngineTables, AnEngineTableOverridesItsKeysForThatEngineAlone) {
  const Config c = load_engines(
      "[zero]\nstage = 1\nbucket_mb = 4\n"
      "[engine.generator]\ngrad_accum = 2\n"
      "[engine.generator.zero]\nstage = 3\n"
      "[engine.generator.offload]\noptimizer = \"cpu\"\n",
      {"engine.discriminator.precision.dtype=\"bf16\""});
  EXPECT_EQ(c.zero.stage, 1);  // the run's own
  ASSERT_EQ(c.engines.count("generator"), 1u);
  const EngineTable& g = c.engines.at("generator");
  EXPECT_EQ(g.config->zero.stage, 3);
  EXPECT_DOUBLE_EQ(g.config->zero.bucket_mb, 4.0);  // inherited key by key
  EXPECT_EQ(g.config->offload.optimizer, OffloadTarget::kCpu);
  EXPECT_EQ(g.config->train.grad_accum, 2);
  EXPECT_EQ(g.config->train.global_batch_size, 0);  // inferred from the run's micro-batch
  EXPECT_EQ(g.keys, (std::vector<std::string>{"train.grad_accum", "offload.optimizer", "zero.stage"}));
  EXPECT_EQ(g.config->position_of("zero.stage"), " at " + path_ + ":7:9");  // the value
  EXPECT_EQ(g.config->position_of("zero.bucket_mb"), " at " + path_ + ":3:13");
  const EngineTable& d = c.engines.at("discriminator");
  EXPECT_EQ(d.config->precision.dtype, Dtype::kBf16);
  EXPECT_EQ(d.config->zero.stage, 1);

  // Printed and hashed with the run: a rank holding other engine tables differs.
  const std::string printed = to_toml(c);
  EXPECT_CONTAINS(printed, "[engine.generator]\ngrad_accum = 2\n");
  EXPECT_CONTAINS(printed, "[engine.generator.zero]\nstage = 3\n");
  const std::string again_path = write("printed.toml", printed);
  const Config again = load_config(ConfigSources{{again_path}, {}}, LoadOptions{{}, {"generator", "discriminator"}});
  EXPECT_EQ(to_toml(again), printed);
  EXPECT_NE(config_hash(again), config_hash(load_engines("[zero]\nstage = 1\nbucket_mb = 4\n")));
}

TEST_F(EngineTables, AnUndeclaredEngineIsRefusedWithTheDeclaredOnes) {
  EXPECT_CONTAINS(error_loading("[engine.generater.zero]\nstage = 3\n"),
                  "unknown engine [engine.generater] at " + path_ + ":1:9; did you mean [engine.generator]?");
  EXPECT_CONTAINS(error_loading("[engine.critic]\ngrad_accum = 2\n"),
                  "this application's engines: generator, discriminator");
  EXPECT_CONTAINS(error_of([&] { load({write("a.toml", "[engine.g]\ngrad_accum = 2\n")}); }),
                  "this application names no engines of its own (InitOptions::engines)");
}

TEST_F(EngineTables, WhatAnEngineTableCannotHoldIsNamedWithWhy) {
  EXPECT_CONTAINS(error_loading("[engine.generator.parallel]\ntp = 2\n"),
                  "[engine.generator.parallel] at " + path_ +
                      ":1:19: every engine shares the run's [parallel] (one mesh, one data-parallel batch per rank, "
                      "one log); an engine table holds grad_accum, [zero], [offload] and [precision]");
  EXPECT_CONTAINS(error_loading("[engine.generator]\ngrad_acum = 2\n"),
                  "unknown key 'engine.generator.grad_acum' at " + path_ + ":2:1; did you mean 'grad_accum'?");
  EXPECT_CONTAINS(error_loading("[engine.generator.zero]\nstag = 3\n"),
                  "unknown key 'engine.generator.zero.stag' at " + path_ + ":2:1; did you mean 'stage'?");
  EXPECT_CONTAINS(error_loading("[engine.generator.zero]\nstage = 4\n"),
                  "engine.generator.zero.stage = 4 at " + path_ + ":2:9: expected");
  EXPECT_CONTAINS(error_loading("[engine.generator]\ngrad_accum = 0\n"), "engine.generator.grad_accum");
  EXPECT_CONTAINS(error_loading("[engine.generator]\nzero = 3\n"),
                  "engine.generator.zero = 3 at " + path_ + ":2:8: expected a table [engine.generator.zero]");
}

// The sections' own checks run on each engine's combination: offloading needs ZeRO.
TEST_F(EngineTables, AnEnginesCombinationIsCheckedAsTheRunsIs) {
  const std::string error = error_loading("[zero]\nstage = 2\n[engine.discriminator.zero]\nstage = 0\n"
                                          "[engine.discriminator.offload]\noptimizer = \"cpu\"\n");
  EXPECT_CONTAINS(error, "[engine.discriminator]: ");
  EXPECT_CONTAINS(error, "offload.optimizer");
}

}  // namespace
}  // namespace parallax
