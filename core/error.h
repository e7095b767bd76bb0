// Parallax's error types and the check macros that throw them.
//
// Every error Parallax raises is a `parallax::Error` (a std::runtime_error) whose
// message starts with the rank that raised it, e.g.
//   "[rank 3] ConfigError: zero.stage = 4 at train.toml:12:9: expected 0..3".
// Library code never exits or aborts: it throws, and the application decides.
//
//   PARALLAX_CHECK(stage <= 3, ConfigError, "zero.stage = ", stage, ": expected 0..3");
//
// The message is only built when the check fails.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace parallax {

/// Base of every exception Parallax throws. `what()` includes the rank prefix;
/// `detail()` is the message without it.
class Error : public std::runtime_error {
 public:
  Error(const std::string& kind, const std::string& detail);
  const std::string& kind() const { return kind_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string kind_;
  std::string detail_;
};

#define PARALLAX_DEFINE_ERROR(Name)                                    \
  class Name : public Error {                                          \
   public:                                                             \
    explicit Name(const std::string& detail) : Error(#Name, detail) {} \
  }

/// Invalid configuration: TOML, command-line overrides, inconsistent degrees.
PARALLAX_DEFINE_ERROR(ConfigError);
/// A failed or timed-out collective or point-to-point operation.
PARALLAX_DEFINE_ERROR(CommError);
/// Topology discovery or an impossible placement.
PARALLAX_DEFINE_ERROR(TopologyError);
/// A failure of offloaded state: a read or write of the NVMe tier's file.
PARALLAX_DEFINE_ERROR(OffloadError);
/// A checkpoint that cannot be written, or a torn, truncated or corrupted one.
PARALLAX_DEFINE_ERROR(CheckpointError);
/// Invalid use of the public API (wrong argument, wrong call order).
PARALLAX_DEFINE_ERROR(UsageError);
/// A broken internal invariant: a bug in Parallax, not in the caller.
PARALLAX_DEFINE_ERROR(InternalError);

#undef PARALLAX_DEFINE_ERROR

/// The identity printed in front of messages: set once by World::init from the MPI
/// rank, "rank ?" before that. This is the one process-wide value Parallax keeps; it
/// is written once, before any other thread exists, and only read afterwards.
void set_process_rank(int rank);
/// The rank set by set_process_rank, or -1 before MPI is initialized.
int process_rank();
/// "[rank 3] " (or "[rank ?] " before MPI is up).
std::string rank_prefix();

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace detail
}  // namespace parallax

/// Throws `parallax::ErrorType` with the concatenated message when `cond` is false.
#define PARALLAX_CHECK(cond, ErrorType, ...)                                \
  do {                                                                      \
    if (!(cond)) {                                                          \
      throw ::parallax::ErrorType(::parallax::detail::concat(__VA_ARGS__)); \
    }                                                                       \
  } while (false)

/// Internal invariant: a failure is a Parallax bug and names the file and line.
#define PARALLAX_ASSERT(cond, ...)                                                                                   \
  do {                                                                                                               \
    if (!(cond)) {                                                                                                   \
      throw ::parallax::InternalError(                                                                               \
          ::parallax::detail::concat(__FILE__, ":", __LINE__, ": assertion `", #cond, "` failed. ", ##__VA_ARGS__)); \
    }                                                                                                                \
  } while (false)
