// [engine.<name>] tables: one engine's options over the run's (a trainer with several
// models, each its own engine). An engine table holds grad_accum and the [zero],
// [offload] and [precision] sections, read by the same field tables as the run's and
// checked by the same section checks; the engines share the rest.
#include <algorithm>
#include <memory>
#include <ostream>

#include "parallax/core/config_toml.h"
#include "parallax/core/error.h"

namespace parallax::detail {
namespace {

const std::vector<std::string> kEngineSections{"zero", "offload", "precision"};
const std::vector<std::string> kEngineKeys{"grad_accum", "zero", "offload", "precision"};

[[noreturn]] void throw_not_an_engine_key(const std::string& table, const toml::key& key) {
  const std::string name(key.str());
  const std::vector<std::string> shared{"parallel", "tensor_parallel", "pipeline", "topology", "comm", "train",
                                        "optimizer", "scheduler", "checkpoint", "logging", "threads"};
  if (std::find(shared.begin(), shared.end(), name) != shared.end()) {
    throw ConfigError("[" + table + "." + name + "]" + at(key.source()) + ": every engine shares the run's [" + name +
                      "] (one mesh, one data-parallel batch per rank, one log); an engine table holds grad_accum, " +
                      "[zero], [offload] and [precision]");
  }
  throw_unknown_key(table, key, kEngineKeys);
}

// The table [engine.<name>] over a copy of the run's config.
EngineTable read_engine(const std::string& name, toml::table&& table, const Config& run, const KeyPositions& run_positions) {
  const std::string path = "engine." + name;
  auto config = std::make_shared<Config>(run);
  config->engines.clear();
  KeyPositions positions = run_positions;
  EngineTable engine;
  for (auto&& [key, node] : table) {
    const std::string field(key.str());
    if (field == "grad_accum") {
      // Read by [train]'s own field rules, as train.grad_accum.
      toml::table train;
      train.insert("grad_accum", std::move(node));
      read_section(*find_section("train"), train, *config, positions, path);
      PARALLAX_CHECK(config->train.grad_accum >= 1, ConfigError, path, ".grad_accum", positions["train.grad_accum"],
                     ": expected an integer >= 1 (an engine's micro-batches per optimizer step)");
      engine.keys.push_back("train.grad_accum");
      continue;
    }
    if (std::find(kEngineSections.begin(), kEngineSections.end(), field) == kEngineSections.end()) {
      throw_not_an_engine_key(path, key);
    }
    PARALLAX_CHECK(node.is_table(), ConfigError, path, ".", field, " = ", render(node), at(node.source()),
                   ": expected a table [", path, ".", field, "]");
    const toml::table& section_table = *node.as_table();
    read_section(*find_section(field), section_table, *config, positions, path + "." + field);
    for (const auto& [section_key, value] : section_table) engine.keys.push_back(field + "." + std::string(section_key.str()));
  }
  // An engine of its own grad_accum infers its global batch from the run's micro-batch.
  if (std::find(engine.keys.begin(), engine.keys.end(), "train.grad_accum") != engine.keys.end()) {
    config->train.global_batch_size = 0;
    positions.erase("train.global_batch_size");
  }
  for (const SectionDef& section : sections()) {
    if (section.check == nullptr) continue;
    try {
      section.check(*config, positions);
    } catch (const ConfigError& e) {
      throw ConfigError("[" + path + "]: " + e.detail());
    }
  }
  config->positions = std::move(positions);
  engine.config = std::move(config);
  return engine;
}

}  // namespace

void read_engine_tables(toml::node&& engines,
                        Config& config,
                        const KeyPositions& positions,
                        const std::vector<std::string>& declared) {
  PARALLAX_CHECK(engines.is_table(), ConfigError, "engine = ", render(engines), at(engines.source()),
                 ": expected tables [engine.<name>], one per engine the application names");
  for (auto&& [key, node] : *engines.as_table()) {
    const std::string name(key.str());
    if (std::find(declared.begin(), declared.end(), name) == declared.end()) {
      std::string message = "unknown engine [engine." + name + "]" + at(key.source());
      const std::string suggestion = closest(name, declared);
      if (!suggestion.empty()) message += "; did you mean [engine." + suggestion + "]?";
      message += declared.empty() ? "; this application names no engines of its own (InitOptions::engines)"
                                  : "; this application's engines: " + join(declared, ", ");
      throw ConfigError(message);
    }
    PARALLAX_CHECK(node.is_table(), ConfigError, "engine.", name, " = ", render(node), at(node.source()),
                   ": expected a table [engine.", name, "]");
    config.engines[name] = read_engine(name, std::move(*node.as_table()), config, positions);
  }
}

void write_engine_tables(const Config& config, std::ostream& out) {
  for (const auto& [name, engine] : config.engines) {
    const std::string path = "engine." + name;
    out << "\n[" << path << "]\n";
    if (std::find(engine.keys.begin(), engine.keys.end(), "train.grad_accum") != engine.keys.end()) {
      out << "grad_accum = " << engine.config->train.grad_accum << "\n";
    }
    for (const std::string& section : kEngineSections) {
      out << "\n";
      write_section(*find_section(section), *engine.config, out, path + "." + section);
    }
  }
}

}  // namespace parallax::detail
