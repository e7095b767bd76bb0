// Rank-aware logging to stderr.
//
// Every line carries the rank, "[rank 3] warn: bucket ...", except rank 0's summary
// lines written with `Logger::summary`. The level is chosen by `[logging] level`.
//
//   Logger log(LogLevel::kInfo);
//   log.info("bucket ", i, " holds ", bytes, " bytes");
#pragma once

#include <string>

#include "parallax/core/error.h"

namespace parallax {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

/// "debug", "info", "warn", "error".
const char* to_string(LogLevel level);
/// Parses the names above; throws ConfigError naming the value otherwise.
LogLevel parse_log_level(const std::string& name);

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kInfo) : level_(level) {}

  LogLevel level() const { return level_; }
  bool enabled(LogLevel level) const { return level >= level_; }

  template <typename... Args>
  void debug(const Args&... args) const {
    write(LogLevel::kDebug, detail::concat(args...));
  }
  template <typename... Args>
  void info(const Args&... args) const {
    write(LogLevel::kInfo, detail::concat(args...));
  }
  template <typename... Args>
  void warn(const Args&... args) const {
    write(LogLevel::kWarn, detail::concat(args...));
  }
  template <typename... Args>
  void error(const Args&... args) const {
    write(LogLevel::kError, detail::concat(args...));
  }

  /// Writes the line to stdout without a rank prefix when called on rank 0; does
  /// nothing on other ranks. For progress lines and final summaries.
  template <typename... Args>
  void summary(const Args&... args) const {
    write_summary(detail::concat(args...));
  }

 private:
  void write(LogLevel level, const std::string& line) const;
  void write_summary(const std::string& line) const;

  LogLevel level_;
};

}  // namespace parallax
