// The cross-key checks of the Parallax sections (SectionDef::check): what keys say
// together inside one section, or against this build, after every section is read.
// The rows that name them are in config_sections.cpp.
#include <algorithm>
#include <string>

#include "parallax/core/config_loader.h"
#include "parallax/core/config_toml.h"
#include "parallax/core/error.h"

namespace parallax {
namespace detail {

namespace {

std::string position(const KeyPositions& positions, const std::string& key) {
  const auto found = positions.find(key);
  return found == positions.end() ? "" : found->second;
}

}  // namespace

// A key that only some optimizer types read must keep its default under the others.
void optimizer_check(const Config& c, const KeyPositions& positions) {
  using T = OptimizerType;
  const OptimizerOptions& o = c.optimizer;
  const OptimizerOptions defaults;
  struct TypeKey {
    const char* key;
    std::string value;  // "" while the key holds its default
    std::vector<T> types;
    const char* owners;
  };
  const auto number = [](double value, double fallback) { return value == fallback ? "" : format_double(value); };
  const auto flag = [](bool value) { return value ? std::string("true") : std::string(); };
  const TypeKey keys[] = {
      {"momentum", number(o.momentum, defaults.momentum), {T::kSgd, T::kRmsprop},
       "type = \"sgd\" and \"rmsprop\" only; Adam's momentum is optimizer.betas"},
      {"dampening", number(o.dampening, defaults.dampening), {T::kSgd}, "type = \"sgd\" only"},
      {"nesterov", flag(o.nesterov), {T::kSgd}, "type = \"sgd\" only"},
      {"amsgrad", flag(o.amsgrad), {T::kAdam, T::kAdamW}, "type = \"adam\" and \"adamw\" only"},
      {"alpha", number(o.alpha, defaults.alpha), {T::kRmsprop}, "type = \"rmsprop\" only"},
      {"centered", flag(o.centered), {T::kRmsprop}, "type = \"rmsprop\" only"},
      {"lr_decay", number(o.lr_decay, defaults.lr_decay), {T::kAdagrad}, "type = \"adagrad\" only"},
      {"initial_accumulator_value", number(o.initial_accumulator_value, defaults.initial_accumulator_value),
       {T::kAdagrad}, "type = \"adagrad\" only"},
  };
  for (const TypeKey& k : keys) {
    const bool applies = std::find(k.types.begin(), k.types.end(), o.type) != k.types.end();
    const std::string key = std::string("optimizer.") + k.key;
    PARALLAX_CHECK(k.value.empty() || applies, ConfigError, key, " = ", k.value, position(positions, key), ": ",
                   k.key, " applies to ", k.owners, " (optimizer.type = \"", to_string(o.type), "\"",
                   position(positions, "optimizer.type"), ")");
  }
  for (const std::string& kind : o.no_decay) {
    PARALLAX_CHECK(kind == "bias" || kind == "norm" || kind == "embedding", ConfigError, "optimizer.no_decay = [..., \"",
                   kind, "\", ...]", position(positions, "optimizer.no_decay"),
                   ": expected kinds among \"bias\", \"norm\" and \"embedding\"");
  }
  PARALLAX_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), ConfigError, "optimizer.nesterov = true",
                 position(positions, "optimizer.nesterov"), ": Nesterov momentum needs optimizer.momentum > 0 (",
                 format_double(o.momentum), ") and optimizer.dampening = 0 (", format_double(o.dampening), ")");
}

void checkpoint_check(const Config& c, const KeyPositions& positions) {
  PARALLAX_CHECK(!c.checkpoint.dir.empty() || (c.checkpoint.every == 0 && c.checkpoint.load != "latest"), ConfigError,
                 c.checkpoint.every != 0 ? "checkpoint.every = " + std::to_string(c.checkpoint.every) +
                                               position(positions, "checkpoint.every")
                                         : "checkpoint.load = \"latest\"" + position(positions, "checkpoint.load"),
                 ": set checkpoint.dir, the directory the checkpoints go under");
  const std::string& out = c.checkpoint.export_on_finish;
  const auto ends_with = [&](const std::string& suffix) {
    return out.size() > suffix.size() && out.compare(out.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  PARALLAX_CHECK(out.empty() || ends_with(".safetensors") || ends_with(".pt") || ends_with(".pth"), ConfigError,
                 "checkpoint.export_on_finish = \"", out, "\"", position(positions, "checkpoint.export_on_finish"),
                 ": expected a file ending in .safetensors, .pt or .pth (the format is chosen by the extension)");
  PARALLAX_CHECK(out.empty() || !c.checkpoint.dir.empty(), ConfigError, "checkpoint.export_on_finish = \"", out, "\"",
                 position(positions, "checkpoint.export_on_finish"),
                 ": set checkpoint.dir, where the final checkpoint it exports is saved");
}

void scheduler_check(const Config& c, const KeyPositions& positions) {
  PARALLAX_CHECK(c.scheduler.min_lr <= c.optimizer.lr, ConfigError,
                 "scheduler.min_lr = ", format_double(c.scheduler.min_lr), position(positions, "scheduler.min_lr"),
                 ": expected a number <= optimizer.lr (", format_double(c.optimizer.lr),
                 position(positions, "optimizer.lr"), ")");
}

void precision_check(const Config& c, const KeyPositions& positions) {
  PARALLAX_CHECK(c.precision.loss_scale_min <= c.precision.loss_scale_initial, ConfigError,
                 "precision.loss_scale_min = ", format_double(c.precision.loss_scale_min),
                 position(positions, "precision.loss_scale_min"),
                 ": expected a number <= precision.loss_scale_initial (", format_double(c.precision.loss_scale_initial),
                 position(positions, "precision.loss_scale_initial"), ")");
}

// Whether the directory can take the NVMe tier's files is checked where they are
// created (offload/), on every rank's own node; here only what the keys say.
void offload_check(const Config& c, const KeyPositions& positions) {
  const OffloadOptions& o = c.offload;
  const std::string optimizer =
      std::string("offload.optimizer = \"") + to_string(o.optimizer) + "\"" + position(positions, "offload.optimizer");
  const std::string param =
      std::string("offload.param = \"") + to_string(o.param) + "\"" + position(positions, "offload.param");
  if (o.optimizer != OffloadTarget::kNone) {
    PARALLAX_CHECK(c.zero.stage >= 1, ConfigError, optimizer,
                   ": offloading moves ZeRO's sharded optimizer state to the host; it needs zero.stage = 1, 2 or 3 "
                   "(zero.stage = ",
                   c.zero.stage, position(positions, "zero.stage"), ")");
    PARALLAX_CHECK(is_adam_family(c.optimizer.type), ConfigError, optimizer,
                   ": the offloaded step is the fused CPU Adam; optimizer.type = \"", to_string(c.optimizer.type),
                   "\"", position(positions, "optimizer.type"), " cannot be offloaded (use \"adam\" or \"adamw\")");
  }
  if (o.param != OffloadTarget::kNone) {
    PARALLAX_CHECK(c.zero.stage == 3, ConfigError, param,
                   ": only zero.stage = 3 shards the parameters, so only it can offload them (zero.stage = ",
                   c.zero.stage, position(positions, "zero.stage"), ")");
    PARALLAX_CHECK(o.optimizer != OffloadTarget::kNone, ConfigError, param,
                   ": an offloaded parameter shard is the optimizer's fp32 master on the host; set offload.optimizer = "
                   "\"cpu\" or \"nvme\" too");
    PARALLAX_CHECK(o.param != OffloadTarget::kNvme || o.optimizer == OffloadTarget::kNvme, ConfigError, param,
                   ": the master shard on NVMe is streamed with the optimizer's moments; set offload.optimizer = "
                   "\"nvme\" too (or offload.param = \"cpu\")");
  }
  if (o.optimizer == OffloadTarget::kNvme || o.param == OffloadTarget::kNvme) {
    PARALLAX_CHECK(!o.nvme_path.empty(), ConfigError, o.optimizer == OffloadTarget::kNvme ? optimizer : param,
                   ": the NVMe tier needs offload.nvme_path, a writable directory on a local drive of every node");
  } else {
    PARALLAX_CHECK(o.nvme_path.empty(), ConfigError, "offload.nvme_path = \"", o.nvme_path, "\"",
                   position(positions, "offload.nvme_path"),
                   ": no NVMe tier is in use (offload.optimizer and offload.param are not \"nvme\"); remove the key or "
                   "set one of them to \"nvme\"");
  }
}

// What the keys say together; whether the model's layers split that way is the
// pipeline engine's question, answered when it is built.
void pipeline_check(const Config& c, const KeyPositions& positions) {
  const PipelineOptions& p = c.pipeline;
  const std::string schedule =
      std::string("pipeline.schedule = \"") + to_string(p.schedule) + "\"" + position(positions, "pipeline.schedule");
  if (p.schedule == PipelineSchedule::kInterleaved) {
    PARALLAX_CHECK(p.virtual_stages > 1, ConfigError, schedule, ": interleaving needs pipeline.virtual_stages > 1 (",
                   p.virtual_stages, position(positions, "pipeline.virtual_stages"),
                   "), the model chunks each rank holds");
    PARALLAX_CHECK(c.parallel.pp > 1, ConfigError, schedule,
                   ": interleaving passes chunks between pipeline stages; it needs parallel.pp > 1");
  } else {
    PARALLAX_CHECK(p.virtual_stages == 1, ConfigError, "pipeline.virtual_stages = ", p.virtual_stages,
                   position(positions, "pipeline.virtual_stages"),
                   ": only schedule = \"interleaved\" runs several "
                   "chunks per rank; ",
                   schedule, " needs 1");
  }
  if (p.partition == PipelinePartition::kExplicit) {
    const std::string where = position(positions, "pipeline.partition");
    const std::size_t parts = static_cast<std::size_t>(c.parallel.pp) * static_cast<std::size_t>(p.virtual_stages);
    PARALLAX_CHECK(p.boundaries.size() == parts + 1, ConfigError, "pipeline.partition", where, ": a list of ",
                   parts + 1, " boundaries expected (0, the first layer of each of the other ", parts - 1,
                   " parts, then the layer count) for pp = ", c.parallel.pp, " x virtual_stages = ", p.virtual_stages,
                   "; got ", p.boundaries.size());
    PARALLAX_CHECK(p.boundaries.front() == 0, ConfigError, "pipeline.partition", where,
                   ": the first boundary must be 0, got ", p.boundaries.front());
    for (std::size_t i = 1; i < p.boundaries.size(); ++i) {
      PARALLAX_CHECK(p.boundaries[i] > p.boundaries[i - 1], ConfigError, "pipeline.partition", where,
                     ": boundaries must increase (every part holds a layer); ", p.boundaries[i - 1], " is followed by ",
                     p.boundaries[i]);
    }
  }
}

// Which options each style takes; whether a module fits its rule is the plan's question
// (tensor_parallel/parallelize.h), answered against the model at engine creation.
void tensor_parallel_check(const Config& c, const KeyPositions&) {
  for (const TpPlanRule& rule : c.tensor_parallel.plan) {
    const std::string name = std::string("tensor_parallel.plan.\"") + rule.pattern + "\"" + rule.position;
    const char* style = to_string(rule.style);
    PARALLAX_CHECK(rule.parts == 1 || rule.style == TpStyle::kColumn, ConfigError, name, ": parts = ", rule.parts,
                   " applies to style \"column\" only (a fused projection such as [q | k | v]), not \"", style, "\"");
    PARALLAX_CHECK(rule.heads == 0 || rule.style == TpStyle::kColumn || rule.style == TpStyle::kRow, ConfigError, name,
                   ": heads = ", rule.heads, " applies to styles \"column\" and \"row\" only, not \"", style, "\"");
    PARALLAX_CHECK(!rule.gather_output || rule.parts == 1, ConfigError, name,
                   ": gather_output with parts = ", rule.parts,
                   " would interleave the fused blocks across ranks; gather the blocks after splitting them, or use "
                   "separate rules");
    PARALLAX_CHECK(!rule.gather_output || rule.style == TpStyle::kColumn || rule.style == TpStyle::kVocabOutput,
                   ConfigError, name, ": gather_output applies to styles \"column\" and \"vocab_output\" only, not \"",
                   style, "\"");
  }
}

}  // namespace detail
}  // namespace parallax
