// The input side of the config loader: the command line, files and `extends`, the
// merge, `--set` overrides, and the dispatch of each top-level table to its reader.
// What each section accepts lives in config_sections.cpp; to_toml there too.
#include "parallax/core/config_loader.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string_view>

#include "parallax/core/config_toml.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

namespace fs = std::filesystem;
using detail::at;
using detail::join;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

// ---- Files and extends -------------------------------------------------------------

/// Merges `source` into `target` key by key: tables merge recursively, anything else
/// (arrays included) replaces what was there. Nodes are moved, not copied, because a
/// move keeps their source position (TOML++ drops it on copy) and every later error
/// message needs it.
void merge_into(toml::table& target, toml::table&& source) {
  for (auto&& [key, node] : source) {
    toml::node* existing = target.get(key.str());
    if (existing != nullptr && existing->is_table() && node.is_table()) {
      merge_into(*existing->as_table(), std::move(*node.as_table()));
      continue;
    }
    // Replace the key too, so that an unknown-key error points at the winning file.
    toml::key winning_key = key;
    target.erase(key.str());
    target.insert(std::move(winning_key), std::move(node));
  }
}

// Debian's TOML++ 3.3 reaches undefined behaviour when it tests a non-ASCII code point
// for whitespace (marzer/tomlplusplus#295, fixed upstream in 2026), which it does wherever
// whitespace may stand: outside strings and comments, where TOML allows no non-ASCII
// character anyway, and after a multi-line basic string's line-ending backslash. Such
// text is refused here with a parse error, as TOML++'s own, before TOML++ sees it.
// A quote opens a string only where TOML lets one start (first on a line, or after
// = [ { , or .): elsewhere, as in `1e-'x`, TOML++ reads on through it as part of a bare
// value, testing each character for whitespace.
void refuse_what_toml_cannot_parse_safely(const std::string& text, const std::string& name) {
  const auto fail = [&](std::size_t at, const char* what) {
    toml::source_position position{1, 1};
    for (std::size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') {
        ++position.line;
        position.column = 1;
      } else {
        ++position.column;
      }
    }
    throw toml::parse_error(what, position, std::make_shared<const std::string>(name));
  };
  const auto quotes_at = [&](std::size_t at, char quote) {
    std::size_t n = 0;
    while (at + n < text.size() && text[at + n] == quote) ++n;
    return n;
  };
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral } in = In::kCode;
  bool string_may_start = true;  // in code: a quote here opens a string
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    switch (in) {
      case In::kCode:
        if (c >= 0x80) fail(i, "a non-ASCII character outside a string or comment");
        if (c == '#') {
          in = In::kComment;
        } else if ((c == '"' || c == '\'') && string_may_start) {
          const bool multi = quotes_at(i, static_cast<char>(c)) >= 3;
          in = c == '"' ? (multi ? In::kMultiBasic : In::kBasic) : (multi ? In::kMultiLiteral : In::kLiteral);
          if (multi) i += 2;
          string_may_start = false;
        } else if (c == '\n') {
          string_may_start = true;
        } else if (c != ' ' && c != '\t' && c != '\r') {
          string_may_start = std::string_view("=[{,.").find(static_cast<char>(c)) != std::string_view::npos;
        }
        break;
      case In::kComment:
        if (c == '\n') {
          in = In::kCode;
          string_may_start = true;
        }
        break;
      case In::kBasic:
        if (c == '\\') {
          ++i;  // the escaped character
        } else if (c == '"' || c == '\n') {
          in = In::kCode;
        }
        break;
      case In::kLiteral:
        if (c == '\'' || c == '\n') in = In::kCode;
        break;
      case In::kMultiBasic:
      case In::kMultiLiteral: {
        const char quote = in == In::kMultiBasic ? '"' : '\'';
        if (in == In::kMultiBasic && c == '\\') {
          std::size_t next = i + 1;
          while (next < text.size() && (text[next] == ' ' || text[next] == '\t')) ++next;
          if (next < text.size() && (text[next] == '\n' || text[next] == '\r')) {  // a line-ending backslash
            while (next < text.size() && std::string(" \t\r\n").find(text[next]) != std::string::npos) ++next;
            if (next < text.size() && static_cast<unsigned char>(text[next]) >= 0x80) {
              fail(next, "a non-ASCII character first after a line-ending backslash in a multi-line string");
            }
            i = next - 1;
          } else {
            ++i;  // the escaped character
          }
        } else if (c == static_cast<unsigned char>(quote) && quotes_at(i, quote) >= 3) {
          i += std::min<std::size_t>(quotes_at(i, quote), 5) - 1;  // up to two quotes end the content
          in = In::kCode;
        }
        break;
      }
    }
  }
}

// TOML++'s parse of `text`, after the refusal above; an internal check of TOML++'s that
// fails (config_toml.h) is a parse error too.
toml::table parse_toml(const std::string& text, const std::string& name) {
  refuse_what_toml_cannot_parse_safely(text, name);
  try {
    return toml::parse(text, name);
  } catch (const detail::TomlAssertion& failed) {
    throw toml::parse_error(
        ("not valid TOML (TOML++ stopped at its check '" + std::string(failed.what()) + "')").c_str(),
        toml::source_position{1, 1}, std::make_shared<const std::string>(name));
  }
}

toml::table parse_file(const fs::path& path, const std::string& included_from) {
  const std::string name = path.string();
  const std::string origin = included_from.empty() ? "" : " (extended from " + included_from + ")";
  std::error_code error;
  PARALLAX_CHECK(fs::is_regular_file(path, error), ConfigError, "config file '", name,
                 "' does not exist or is not a regular file", origin);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  PARALLAX_CHECK(in.good() || in.eof(), ConfigError, "cannot read config file '", name, "'", origin);
  try {
    return parse_toml(text.str(), name);
  } catch (const toml::parse_error& e) {
    throw ConfigError("TOML syntax error at " + detail::location(e.source()) + ": " + std::string(e.description()));
  }
}

/// The file names in an `extends` value, or a ConfigError naming the value.
std::vector<std::string> extended_names(const toml::node& node) {
  std::vector<std::string> names;
  if (const auto* name = node.as_string()) {
    names.push_back(name->get());
    return names;
  }
  const auto* array = node.as_array();
  if (array != nullptr) {
    for (const toml::node& item : *array) {
      if (!item.is_string()) break;
      names.push_back(item.as_string()->get());
    }
    if (names.size() == array->size()) return names;
  }
  throw ConfigError("extends = " + detail::render(node) + at(node.source()) +
                    ": expected a file name or an array of file names");
}

/// The same file reached by two spellings ("a.toml", "x/../a.toml", a link) has the
/// same identity; used to detect extends cycles.
fs::path identity_of(const fs::path& path) {
  std::error_code error;
  fs::path canonical = fs::weakly_canonical(path, error);
  return error ? fs::absolute(path, error).lexically_normal() : canonical;
}

/// Reads `path` and, before it, everything it extends (depth first, in order), merged
/// into one table. `chain` holds the files being read, outermost first, to detect
/// cycles; `read` collects every file once read (bases first).
toml::table load_file(const fs::path& path,
                      const std::string& included_from,
                      std::vector<fs::path>& chain,
                      std::vector<std::string>& read) {
  const fs::path identity = identity_of(path);
  for (std::size_t i = 0; i < chain.size(); ++i) {
    if (identity_of(chain[i]) != identity) continue;
    std::vector<std::string> cycle;
    for (std::size_t j = i; j < chain.size(); ++j) cycle.push_back(chain[j].string());
    cycle.push_back(path.string());
    throw ConfigError("extends cycle: " + join(cycle, " -> ") +
                      (included_from.empty() ? "" : " (at " + included_from + ")"));
  }

  toml::table document = parse_file(path, included_from);
  toml::table merged;
  if (const toml::node* extends = document.get("extends")) {
    chain.push_back(path);
    for (const std::string& name : extended_names(*extends)) {
      const fs::path base =
          fs::path(name).is_absolute() ? fs::path(name) : (path.parent_path() / name).lexically_normal();
      merge_into(merged, load_file(base, detail::location(extends->source()), chain, read));
    }
    chain.pop_back();
    document.erase("extends");
  }
  merge_into(merged, std::move(document));
  read.push_back(path.string());
  return merged;
}

// ---- Overrides ---------------------------------------------------------------------

/// An override `key = value` as a small TOML document, every node and key of which has
/// the override as its source. The key path is TOML (dotted, quoted parts allowed).
/// The value is parsed as TOML; a bare word that is not TOML (adam, m.jsonl) is taken
/// as a string, but text that starts like a string, array or inline table must parse.
toml::table parse_override(const std::string& key, const std::string& value, const std::string& origin) {
  try {
    return parse_toml(key + " = " + value, origin);
  } catch (const toml::parse_error& error) {
    const std::string trimmed = trim(value);
    const bool looks_like_toml = !trimmed.empty() && std::string("\"'[{").find(trimmed[0]) != std::string::npos;
    if (!looks_like_toml) {
      try {
        return parse_toml(key + " = " + detail::quote(trimmed), origin);
      } catch (const toml::parse_error&) {
        // The key itself is malformed: report the first error.
      }
    }
    throw ConfigError(origin + ": cannot parse key.path=value as TOML: " + std::string(error.description()));
  }
}

void apply_override(toml::table& root, const std::string& text) {
  const std::string origin = "--set " + text;
  const auto equals = text.find('=');
  const std::string key = equals == std::string::npos ? "" : trim(text.substr(0, equals));
  PARALLAX_CHECK(!key.empty(), ConfigError, origin, ": expected key.path=value, e.g. --set zero.stage=1");
  toml::table parsed = parse_override(key, text.substr(equals + 1), origin);
  PARALLAX_CHECK(!parsed.contains("extends"), ConfigError, origin,
                 ": extends can only be used in a config file; pass more files with --config");
  // Merged like one more file: a value replaces, a table merges key by key.
  merge_into(root, std::move(parsed));
}

/// Any two batch values determine the third (Config::resolve infers it). Where all three
/// are set in the merged `root` and not all by one source, the values of the oldest
/// source among them give way, grad_accum first, then micro_batch_size, until two
/// remain. Values that agree come back unchanged from the inference; values that
/// contradict a later source are overridden by it (`--set train.micro_batch_size=1` over
/// a file's global_batch_size and grad_accum changes grad_accum). Values all from one
/// source are left for resolve to check. A source's order is its last place in `read`
/// (the files, each after what it extends); the command line's --set comes last.
/// TOML++ names each node's source: the file's path, or "--set ..." (apply_override).
void drop_overridden_batch_values(toml::table& root, const std::vector<std::string>& read) {
  toml::table* train = root.get_as<toml::table>("train");
  if (train == nullptr) return;
  const char* const by_preference[] = {"grad_accum", "micro_batch_size", "global_batch_size"};
  const auto order_of = [&](const char* key) {
    const toml::node* node = train->get(key);
    // Omitted, "auto" for the planner, or not a count: nothing to drop, and a bad value
    // is left for its field's check to name.
    if (node == nullptr || !node->is_integer() || node->as_integer()->get() < 1) return -1;
    const auto& path = node->source().path;
    int order = static_cast<int>(read.size());
    for (std::size_t i = 0; path != nullptr && i < read.size(); ++i) {
      if (read[i] == *path) order = static_cast<int>(i);
    }
    return order;
  };
  while (true) {
    int oldest = INT_MAX, newest = -1;
    for (const char* key : by_preference) {
      const int order = order_of(key);
      if (order < 0) return;  // fewer than three: nothing is over-determined
      oldest = std::min(oldest, order);
      newest = std::max(newest, order);
    }
    if (oldest == newest) return;
    for (const char* key : by_preference) {
      if (order_of(key) != oldest) continue;
      train->erase(key);
      break;
    }
  }
}

// ---- Dispatch ----------------------------------------------------------------------

[[noreturn]] void throw_unknown_table(const toml::key& key, const toml::node& node, const LoadOptions& options) {
  std::vector<std::string> known;
  for (const detail::SectionDef& section : detail::sections()) known.emplace_back(section.name);
  std::vector<std::string> candidates = known;
  candidates.insert(candidates.end(), options.app_tables.begin(), options.app_tables.end());

  const std::string name(key.str());
  std::string message = node.is_table() ? "unknown table [" + name + "]" : "unknown top-level key '" + name + "'";
  message += at(key.source());
  const std::string suggestion = detail::closest(name, candidates);
  if (!suggestion.empty()) message += "; did you mean [" + suggestion + "]?";
  message += "; known tables: " + join(known, ", ");
  message += options.app_tables.empty() ? "; this application declares no tables of its own"
                                        : "; tables of this application: " + join(options.app_tables, ", ");
  throw ConfigError(message);
}

void check_app_table_names(const LoadOptions& options) {
  for (const std::string& name : options.app_tables) {
    PARALLAX_CHECK(!name.empty() && name.find('.') == std::string::npos, UsageError, "LoadOptions::app_tables: '", name,
                   "' is not a valid table name");
    PARALLAX_CHECK(detail::find_section(name) == nullptr && name != "extends" && name != "engine", UsageError,
                   "LoadOptions::app_tables: '",
                   name,
                   "' is a Parallax table and cannot be "
                   "owned by the application");
  }
}

}  // namespace

CommandLine parse_command_line(int argc, const char* const* argv) {
  CommandLine result;
  if (argv == nullptr) return result;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i] != nullptr ? argv[i] : "";
    if (i == 0) {
      result.rest.push_back(arg);
      continue;
    }
    if (arg == "--") {  // everything from here on belongs to the application
      result.rest.insert(result.rest.end(), argv + i, argv + argc);
      break;
    }
    std::string option;
    std::string value;
    if (arg == "--config" || arg == "--set") {
      option = arg;
      PARALLAX_CHECK(i + 1 < argc && argv[i + 1] != nullptr, UsageError, option,
                     " needs a value, e.g. --config train.toml or --set zero.stage=1");
      value = argv[++i];
    } else if (starts_with(arg, "--config=") || starts_with(arg, "--set=")) {
      option = arg.substr(0, arg.find('='));
      value = arg.substr(option.size() + 1);
    } else {
      result.rest.push_back(arg);
      continue;
    }
    PARALLAX_CHECK(!value.empty(), UsageError, option, " needs a non-empty value");
    if (option == "--config") {
      result.sources.files.push_back(value);
    } else {
      const auto equals = value.find('=');
      PARALLAX_CHECK(equals != std::string::npos && equals > 0, UsageError, "--set '", value,
                     "': expected key.path=value, e.g. --set zero.stage=1");
      result.sources.overrides.push_back(value);
    }
  }
  return result;
}

Config load_config(const ConfigSources& sources, const LoadOptions& options) {
  check_app_table_names(options);
  Config config;

  toml::table root;
  for (const std::string& file : sources.files) {
    std::vector<fs::path> chain;
    merge_into(root, load_file(file, "", chain, config.sources));
  }
  for (const std::string& text : sources.overrides) apply_override(root, text);
  drop_overridden_batch_values(root, config.sources);

  detail::KeyPositions positions;
  toml::node* engine_tables = nullptr;  // read over the run's sections, once they are checked
  for (auto&& [key, node] : root) {
    const std::string name(key.str());
    if (name == "engine") {
      engine_tables = &node;
      continue;
    }
    const detail::SectionDef* section = detail::find_section(name);
    const bool is_app =
        std::find(options.app_tables.begin(), options.app_tables.end(), name) != options.app_tables.end();
    if (section == nullptr && !is_app) throw_unknown_table(key, node, options);
    PARALLAX_CHECK(node.is_table(), ConfigError, name, " = ", detail::render(node), at(node.source()),
                   ": expected a table [", name, "]");
    if (section != nullptr) {
      detail::read_section(*section, *node.as_table(), config, positions);
    } else {
      auto impl = std::make_shared<const AppTable::Impl>(name, std::move(*node.as_table()));
      config.app.emplace(name, AppTable(std::move(impl)));
    }
  }
  for (const detail::SectionDef& section : detail::sections()) {
    if (section.check != nullptr) section.check(config, positions);
  }
  if (engine_tables != nullptr) detail::read_engine_tables(std::move(*engine_tables), config, positions, options.engines);
  config.positions = std::move(positions);
  return config;
}

void check_sections(const Config& config) {
  for (const detail::SectionDef& section : detail::sections()) {
    if (section.check != nullptr) section.check(config, config.positions);
  }
}

}  // namespace parallax
