// `parallax plan`: the planner (planner/plan_search.h) from the command line.
#pragma once

#include <string>
#include <vector>

namespace parallax::cli {

/// Runs `parallax plan` with its arguments (after "plan"); returns the exit status.
/// Throws UsageError for a bad flag or value, ConfigError for a config file's error or
/// a constraint no layout meets.
int plan_command(const std::vector<std::string>& args);

}  // namespace parallax::cli
