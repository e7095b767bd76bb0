// The strategy sections as a Plan records them, and read back: the same field tables
// that read the user's file, so a key is declared once (config_sections.cpp).
#include <map>
#include <sstream>
#include <string_view>

#include "parallax/core/config_loader.h"
#include "parallax/core/config_toml.h"
#include "parallax/core/error.h"

namespace parallax {

std::string strategy_toml(const Config& config) {
  // Written as values, never as "auto": a recorded strategy is a decided one.
  Config decided = config;
  decided.auto_keys.clear();
  std::ostringstream out;
  for (const detail::SectionDef& section : detail::sections()) {
    if (section.in_plan) detail::write_section(section, decided, out);
  }
  return out.str();
}

namespace {
// A tensor-parallel rule's position lives in the rule; recorded under its own key.
std::string rule_key(const TpPlanRule& rule) {
  return "tensor_parallel.plan." + detail::quote(rule.pattern);
}
}  // namespace

std::map<std::string, std::string> strategy_positions(const Config& config) {
  std::map<std::string, std::string> positions = config.positions;
  for (const TpPlanRule& rule : config.tensor_parallel.plan) {
    if (!rule.position.empty()) positions[rule_key(rule)] = rule.position;
  }
  return positions;
}

Config strategy_config(const std::string& text, const std::map<std::string, std::string>& positions) {
  toml::table table;
  try {
    table = toml::parse(std::string_view(text), std::string_view("recorded strategy"));
  } catch (const toml::parse_error& error) {
    throw ConfigError(detail::concat("the plan's recorded strategy is not TOML (", error.description(), " at ",
                                     detail::location(error.source()), ")"));
  }
  Config config;
  detail::KeyPositions read;
  for (const detail::SectionDef& section : detail::sections()) {
    if (!section.in_plan) continue;
    const toml::table* recorded = table[section.name].as_table();
    PARALLAX_CHECK(recorded != nullptr, ConfigError, "the plan's recorded strategy has no [", section.name,
                   "] section (a plan from another build?)");
    detail::read_section(section, *recorded, config, read);
  }
  config.positions = positions;
  for (TpPlanRule& rule : config.tensor_parallel.plan) {
    const auto found = positions.find(rule_key(rule));
    rule.position = found == positions.end() ? "" : found->second;
  }
  return config;
}

}  // namespace parallax
