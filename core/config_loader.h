// The strict config loader: TOML files and `--set` overrides → a validated Config.
//
// This is where TOML stops (DESIGN.md, "Config"). Files are read in order, each after
// the files it `extends`; tables merge key by key, later values winning; `--set`
// overrides win over every file. The merged document is then checked strictly: an
// unknown key or table, a wrong type, a value out of range or a feature this build
// does not have is a ConfigError naming where the value came from ("a.toml:3:6" or
// "--set optimizer.lr=fast"), the key path, the bad value and what is allowed, with a
// "did you mean" for near-miss keys:
//
//   unknown key 'optimizer.betaz' at a.toml:5:1; did you mean 'betas'?
//   optimizer.lr = "fast" at a.toml:3:6: expected a number
//
// Typical use, on every rank:
//
//   parallax::CommandLine cl = parallax::parse_command_line(argc, argv);
//   parallax::Config config = parallax::load_config(cl.sources, {{"model", "data"}});
//   config.resolve(world.size());                  // dp and the omitted batch value
//   if (rank == 0) std::cout << parallax::to_toml(config);
//   // ... all ranks compare parallax::config_hash(config)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallax/core/config.h"

namespace parallax {

/// Where a configuration comes from, in precedence order (last wins).
struct ConfigSources {
  /// TOML files (`--config FILE`), in order; a later file overrides an earlier one.
  std::vector<std::string> files;
  /// `key.path=value` overrides (`--set`), in order; they override every file.
  std::vector<std::string> overrides;
};

/// The config options found on a command line, and everything else.
struct CommandLine {
  ConfigSources sources;
  /// The arguments that are not Parallax's, untouched and in order, argv[0] first.
  std::vector<std::string> rest;
};

/// Takes "--config FILE", "--config=FILE", "--set k=v" and "--set=k=v" out of argv;
/// every other argument goes to `rest` untouched. A lone "--" ends option parsing: it
/// and everything after it go to `rest`. Does not read any file.
/// Throws UsageError for --config/--set without a value, or a --set value without
/// '=' (or with an empty key).
CommandLine parse_command_line(int argc, const char* const* argv);

/// What the application adds to the Parallax vocabulary.
struct LoadOptions {
  /// Top-level tables the application owns, e.g. {"model", "data"}. They are passed
  /// through unchecked as Config::app; any other unknown table is an error.
  std::vector<std::string> app_tables;
  /// Names of the engines the application builds with its own options (EngineOptions),
  /// e.g. {"generator", "discriminator"}: each may have an [engine.<name>] table, checked
  /// as strictly as the rest into Config::engines; a table for another name is an error.
  std::vector<std::string> engines{};
};

/// Reads `sources.files` in order, each after the files named by its top-level
/// `extends` (a string or an array of strings, relative to the including file's
/// directory), merges tables key by key (later wins; arrays are replaced whole),
/// applies `sources.overrides`, and validates the result strictly into a Config.
/// Config::sources lists the files read, bases before the files that extend them.
/// The Config is not resolved: call Config::resolve once the world size is known.
/// Throws ConfigError for an unreadable file, a TOML syntax error (with file:line:col
/// and the parser's description), an `extends` cycle (listing the chain), a malformed
/// override and every validation failure described at the top of this file.
/// Throws UsageError if an app table name is empty or collides with a Parallax section.
Config load_config(const ConfigSources& sources, const LoadOptions& options = {});

/// The checks load_config runs on each section (what keys say together inside one
/// section: offload needs a ZeRO stage, interleaving needs virtual stages, ...) on a
/// Config built in code, e.g. a planner's candidate. Messages name keys by their
/// positions in `config.positions`. Throws ConfigError on the first failure.
void check_sections(const Config& config);

/// Canonical TOML text of `config`: every Parallax section in a fixed order with every
/// key (defaults included), then the app tables sorted by name. Batch values still 0
/// (to be inferred) appear as comments. load_config on this text (with the same
/// LoadOptions) gives a Config with the same text. Printed on rank 0 and hashed for the cross-rank check. Never throws
/// except std::bad_alloc.
std::string to_toml(const Config& config);

/// The strategy sections of `config` ([train], [precision], [zero], [offload],
/// [tensor_parallel], [pipeline]: each SectionDef marked in_plan) as to_toml writes
/// them, every key with its decided value (never "auto"). A Plan records this text, and
/// strategy_config() reads it back through the same field tables: a strategy's option is
/// declared once, as one key of its section. Never throws except std::bad_alloc.
std::string strategy_toml(const Config& config);

/// Where the keys of `config` were set, for recording beside strategy_toml:
/// config.positions, and each tensor-parallel rule's position under
/// "tensor_parallel.plan.\"<pattern>\"". Never throws except std::bad_alloc.
std::map<std::string, std::string> strategy_positions(const Config& config);

/// A Config at its defaults with `text` (strategy_toml's output) read over it, and
/// `positions` (strategy_positions' output) as its key and rule positions for messages.
/// Throws ConfigError when the text is not TOML, lacks a strategy section, or holds a
/// key or value the field tables refuse (a plan written by another build).
Config strategy_config(const std::string& text, const std::map<std::string, std::string>& positions);

/// Every key the loader reads, "section.key", in to_toml order.
std::vector<std::string> config_keys();

/// The configuration reference (Markdown, kept as docs/config.md): per section, what it
/// is for and how its keys interact, then every key's type, default, allowed values and
/// meaning, from the loader's own field table. Never throws except std::bad_alloc.
std::string config_reference();

/// The candidate closest to `word` by edit distance when close enough to be a typo
/// (for "did you mean"), else "".
std::string closest_spelling(const std::string& word, const std::vector<std::string>& candidates);

/// 64-bit FNV-1a hash of to_toml(config): equal configs give equal hashes on every
/// platform, so ranks can compare them.
std::uint64_t config_hash(const Config& config);

/// Enum names as written in TOML, e.g. "adamw", "cosine", "bf16", "manual", "nccl".
const char* to_string(OptimizerType type);
const char* to_string(SchedulerType type);
const char* to_string(PipelineSchedule schedule);
const char* to_string(PipelinePartition partition);
const char* to_string(Recompute recompute);
const char* to_string(Dtype dtype);
const char* to_string(ParallelMode mode);
const char* to_string(AxisOrder order);
const char* to_string(ContextMethod method);
const char* to_string(OffloadTarget target);
const char* to_string(TpStyle style);
const char* to_string(CommBackend backend);
const char* to_string(TrainDevice device);
const char* to_string(LauncherOrder order);

}  // namespace parallax
