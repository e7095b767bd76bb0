// Internals of the config loader, shared by its .cpp files (parallax_config only).
//
// This is the one header that includes TOML++; it is not installed and no other
// target may include it. It holds:
//   - the AppTable pimpl (an owned toml::table),
//   - message helpers: source positions, values rendered as TOML, "did you mean",
//   - FieldVisitor: one description of a section's keys that serves both reading
//     (validation) and writing (to_toml), so a key cannot be known to one and not
//     the other,
//   - SectionDef and the registry of Parallax sections.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <stdexcept>

namespace parallax::detail {
/// What TOML++'s internal checks (TOML_ASSERT, TOML_ASSERT_ASSUME) throw here instead of
/// being assumed true: Debian's TOML++ 3.3 reaches some of them on malformed input
/// (config_fuzz found "[" followed by a newline), where a release build's assumption is
/// undefined behaviour. The loader reports it as a syntax error.
struct TomlAssertion : std::logic_error {
  using std::logic_error::logic_error;
};
[[noreturn]] inline void toml_assertion_failed(const char* expression) {
  throw TomlAssertion(expression);
}
}  // namespace parallax::detail

#define TOML_ASSERT(expr) ((expr) ? static_cast<void>(0) : ::parallax::detail::toml_assertion_failed(#expr))
#pragma push_macro("NDEBUG")
#undef NDEBUG  // TOML++ then checks TOML_ASSERT_ASSUME with TOML_ASSERT instead of assuming it
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")

#include "parallax/core/config.h"

namespace parallax {

class AppTable::Impl {
 public:
  Impl(std::string name, toml::table table) : name(std::move(name)), table(std::move(table)) {}
  std::string name;
  toml::table table;
};

namespace detail {

// ---- Messages ---------------------------------------------------------------------

/// "a.toml:3:6" for a file position, "--set k=v" for an override, "" if unknown.
std::string location(const toml::source_region& source);
/// " at a.toml:3:6" (with the leading space), or "" if the position is unknown.
std::string at(const toml::source_region& source);
/// A value as TOML writes it: "fast" quoted, 3e-4 as 0.0003, [0.9, 0.95].
std::string render(const toml::node& node);
/// Shortest decimal text that reads back as exactly `value`, valid as a TOML float.
std::string format_double(double value);
/// A TOML basic string literal: quotes and escapes.
std::string quote(const std::string& text);
/// The candidate closest to `key` by edit distance if close enough to be a typo,
/// else "".
std::string closest(const std::string& key, const std::vector<std::string>& candidates);
std::string join(const std::vector<std::string>& items, const char* separator);
/// The error for a key that is not in `known`: names its path and position, suggests
/// the nearest known key or lists them all. `table` is the dotted table path ("" at
/// the top level).
[[noreturn]] void throw_unknown_key(const std::string& table,
                                    const toml::key& key,
                                    const std::vector<std::string>& known);

// ---- Field descriptions --------------------------------------------------------------

/// What a numeric key accepts. `allowed` completes "expected ...".
struct Rule {
  bool (*accepts)(double value);
  const char* allowed;  // e.g. "a number > 0"
};

/// One spelling of an enum in TOML.
template <typename E>
struct EnumName {
  E value;
  const char* name;
};

/// The spellings of TpStyle ([tensor_parallel.plan] values).
inline constexpr EnumName<TpStyle> kTpStyleNames[] = {{TpStyle::kColumn, "column"},
                                                      {TpStyle::kRow, "row"},
                                                      {TpStyle::kVocabEmbedding, "vocab_embedding"},
                                                      {TpStyle::kVocabOutput, "vocab_output"},
                                                      {TpStyle::kReplicate, "replicate"}};

/// Visits the keys of one section with references to their fields. A reader fills the
/// fields from TOML (and validates); a writer prints them. Each key is visited once,
/// in the order it should be printed.
class FieldVisitor {
 public:
  virtual ~FieldVisitor() = default;

  /// How an integer key is stored and what 0 means.
  enum class IntegerKind {
    kInt64,     // std::int64_t field
    kInt32,     // int field: values outside the int range are rejected
    kInferred,  // std::int64_t field where 0 means "not given, inferred later"
  };

  // Each key comes with `meaning`, one line for the configuration reference.
  void integer(const char* key, std::int64_t& value, const Rule& rule, const char* meaning) {
    meaning_ = meaning;
    on_integer(key, value, rule, IntegerKind::kInt64);
  }
  void integer(const char* key, int& value, const Rule& rule, const char* meaning) {
    meaning_ = meaning;
    std::int64_t wide = value;
    on_integer(key, wide, rule, IntegerKind::kInt32);
    value = static_cast<int>(wide);
  }
  /// An integer that may be omitted: 0 in the struct means "not given, inferred
  /// later"; a given value must satisfy `rule`.
  void integer_or_inferred(const char* key, std::int64_t& value, const Rule& rule, const char* meaning) {
    meaning_ = meaning;
    on_integer(key, value, rule, IntegerKind::kInferred);
  }
  void number(const char* key, double& value, const Rule& rule, const char* meaning) {
    meaning_ = meaning;
    on_number(key, value, rule);
  }
  void number_pair(const char* key, std::array<double, 2>& value, const Rule& rule, const char* meaning) {
    meaning_ = meaning;
    on_number_pair(key, value, rule);
  }
  void boolean(const char* key, bool& value, const char* meaning) {
    meaning_ = meaning;
    on_boolean(key, value);
  }
  void text(const char* key, std::string& value, const char* meaning) {
    meaning_ = meaning;
    on_text(key, value);
  }
  void text_list(const char* key, std::vector<std::string>& value, const char* meaning) {
    meaning_ = meaning;
    on_text_list(key, value);
  }
  /// A string among the choices (all but the last), or an array of integers (the last
  /// choice, whose values land in `integers`), e.g. partition = "uniform" or [0, 3, 6].
  template <typename E, std::size_t N>
  void choice_or_integers(const char* key,
                          E& value,
                          const EnumName<E> (&names)[N],
                          std::vector<std::int64_t>& integers,
                          const char* meaning) {
    meaning_ = meaning;
    std::vector<const char*> spelled;
    std::size_t index = 0;
    for (std::size_t i = 0; i < N; ++i) {
      spelled.push_back(names[i].name);
      if (names[i].value == value) index = i;
    }
    on_choice_or_integers(key, index, spelled, integers);
    value = names[index].value;
  }
  /// A table of module path globs → style or { style, parts, heads, gather_output }.
  void module_plan(const char* key, std::vector<TpPlanRule>& rules, const char* meaning) {
    meaning_ = meaning;
    on_module_plan(key, rules);
  }
  template <typename E, std::size_t N>
  void choice(const char* key, E& value, const EnumName<E> (&names)[N], const char* meaning) {
    meaning_ = meaning;
    std::vector<const char*> spelled;
    std::size_t index = 0;
    for (std::size_t i = 0; i < N; ++i) {
      spelled.push_back(names[i].name);
      if (names[i].value == value) index = i;
    }
    on_choice(key, index, spelled);
    value = names[index].value;
  }

 protected:
  virtual void on_integer(const char* key, std::int64_t& value, const Rule& rule, IntegerKind kind) = 0;
  virtual void on_number(const char* key, double& value, const Rule& rule) = 0;
  virtual void on_number_pair(const char* key, std::array<double, 2>& value, const Rule& rule) = 0;
  virtual void on_boolean(const char* key, bool& value) = 0;
  virtual void on_text(const char* key, std::string& value) = 0;
  virtual void on_text_list(const char* key, std::vector<std::string>& value) = 0;
  virtual void on_choice(const char* key, std::size_t& index, const std::vector<const char*>& names) = 0;
  virtual void on_module_plan(const char* key, std::vector<TpPlanRule>& rules) = 0;
  virtual void on_choice_or_integers(const char* key,
                                     std::size_t& index,
                                     const std::vector<const char*>& names,
                                     std::vector<std::int64_t>& integers) = 0;
  /// The meaning of the key being visited.
  const char* meaning() const { return meaning_; }

 private:
  const char* meaning_ = "";
};

/// Where each key that was read came from: "optimizer.lr" → " at a.toml:3:6"
/// (the output of at()). For checks that involve several keys.
using KeyPositions = std::map<std::string, std::string>;

/// One Parallax section. Adding a section is one SectionDef in sections() plus its
/// two functions; nothing else in the loader changes.
struct SectionDef {
  const char* name;  // "optimizer"
  /// What the section is for and how its keys interact with others (the reference's
  /// paragraph under the section's heading).
  const char* about;
  /// Visits every key of the section (see FieldVisitor).
  void (*fields)(FieldVisitor& visitor, Config& config);
  /// Checks that involve several keys or this build's capabilities, after every
  /// section is read. Throws ConfigError. May be null.
  void (*check)(const Config& config, const KeyPositions& positions);
  /// A strategy section: the Plan records it whole (strategy_toml) and the engines read
  /// it back from there, so its keys are declared here once and nowhere else.
  bool in_plan = false;
};

/// The sections' cross-key checks (config_checks.cpp), each SectionDef::check of its
/// section. Throw ConfigError naming the keys, their positions and what is allowed.
void optimizer_check(const Config& config, const KeyPositions& positions);
void scheduler_check(const Config& config, const KeyPositions& positions);
void precision_check(const Config& config, const KeyPositions& positions);
void offload_check(const Config& config, const KeyPositions& positions);
void tensor_parallel_check(const Config& config, const KeyPositions& positions);
void pipeline_check(const Config& config, const KeyPositions& positions);
void checkpoint_check(const Config& config, const KeyPositions& positions);

/// The Parallax sections, in to_toml order.
const std::vector<SectionDef>& sections();
/// The section called `name`, or null.
const SectionDef* find_section(const std::string& name);

/// Reads `table` (the section's TOML table) into `config` through `section.fields`,
/// recording positions; throws ConfigError for unknown keys and bad values. Messages
/// name the keys under `path` (default: the section's name); positions are recorded
/// under the section's name either way.
void read_section(const SectionDef& section,
                  const toml::table& table,
                  Config& config,
                  KeyPositions& positions,
                  const std::string& path = "");
/// Writes "[header]" (default: the section's name) and one "key = value" line per field.
void write_section(const SectionDef& section, const Config& config, std::ostream& out, const std::string& header = "");

// ---- [engine.<name>] tables (config_engines.cpp) ----
/// Reads the top-level `engine` node into config.engines, each table over `config`
/// (its sections already read and checked, `positions` theirs). Throws ConfigError for
/// a name not in `declared`, a key an engine table does not hold, a bad value, or a
/// combination a section's check refuses.
void read_engine_tables(toml::node&& engines,
                        Config& config,
                        const KeyPositions& positions,
                        const std::vector<std::string>& declared);
/// "[engine.<name>]" tables of config.engines, in name order: grad_accum when the table
/// set it, and its sections whole.
void write_engine_tables(const Config& config, std::ostream& out);

}  // namespace detail
}  // namespace parallax
