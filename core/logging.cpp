#include "parallax/core/logging.h"

#include <cstdio>

namespace parallax {

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "?";
}

LogLevel parse_log_level(const std::string& name) {
  for (LogLevel level : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (name == to_string(level)) return level;
  }
  throw ConfigError("logging.level = \"" + name + "\": expected debug, info, warn or error");
}

void Logger::write(LogLevel level, const std::string& line) const {
  if (!enabled(level)) return;
  // One fprintf per line so lines from threads and ranks do not interleave mid-line.
  std::fprintf(stderr, "%s%s: %s\n", rank_prefix().c_str(), to_string(level), line.c_str());
}

void Logger::write_summary(const std::string& line) const {
  if (process_rank() > 0) return;
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace parallax
