// Reading and writing section fields, and the message helpers every config error uses.
//
// TableReader is the strict half of the loader: each visited key is looked up, checked
// for type and range, and recorded; keys nobody visited are unknown. TomlWriter is
// to_toml's half. Both walk the same SectionDef::fields, so the printed config and the
// accepted vocabulary cannot drift apart.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/config_toml.h"
#include "parallax/core/error.h"

namespace parallax::detail {

// ---- Messages ---------------------------------------------------------------------

std::string location(const toml::source_region& source) {
  if (!source.path || source.path->empty()) return "";
  const std::string& path = *source.path;
  // Overrides are parsed from a one-line synthetic document; its line and column
  // would only confuse, the override text itself says where the value came from.
  if (path.rfind("--set ", 0) == 0 || source.begin.line == 0) return path;
  return path + ":" + std::to_string(source.begin.line) + ":" + std::to_string(source.begin.column);
}

std::string at(const toml::source_region& source) {
  std::string where = location(source);
  return where.empty() ? where : " at " + where;
}

std::string format_double(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // std::to_chars gives the shortest text that reads back exactly, independent of
  // the C locale, so to_toml is stable across ranks and round trips.
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";  // TOML needs it for a float
  return text;
}

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string render(const toml::node& node) {
  std::ostringstream out;
  switch (node.type()) {
    case toml::node_type::string:
      return quote(node.as_string()->get());
    case toml::node_type::integer:
      return std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point:
      return format_double(node.as_floating_point()->get());
    case toml::node_type::boolean:
      return node.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array: {
      std::vector<std::string> items;
      for (const toml::node& item : *node.as_array()) items.push_back(render(item));
      return "[" + join(items, ", ") + "]";
    }
    case toml::node_type::table:
      return "(a table)";
    case toml::node_type::date:
      out << *node.as_date();
      break;
    case toml::node_type::time:
      out << *node.as_time();
      break;
    case toml::node_type::date_time:
      out << *node.as_date_time();
      break;
    case toml::node_type::none:
      return "(nothing)";
  }
  return out.str();
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += separator;
    out += items[i];
  }
  return out;
}

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// Optimal string alignment distance: Levenshtein plus adjacent transpositions, the
// commonest typo ("stpes").
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string closest(const std::string& key, const std::vector<std::string>& candidates) {
  // Roughly one typo per three characters, at least one and at most three: close
  // enough to be a slip, far enough that unrelated short names are not suggested.
  const std::size_t limit = std::clamp<std::size_t>(key.size() / 3, 1, 3);
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t distance = edit_distance(lower(key), lower(candidate));
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

void throw_unknown_key(const std::string& table, const toml::key& key, const std::vector<std::string>& known) {
  const std::string path = table.empty() ? std::string(key.str()) : table + "." + std::string(key.str());
  std::string message = "unknown key '" + path + "'" + at(key.source());
  const std::string suggestion = closest(std::string(key.str()), known);
  if (!suggestion.empty()) {
    message += "; did you mean '" + suggestion + "'?";
  } else {
    message += "; [" + table + "] accepts: " + join(known, ", ");
  }
  throw ConfigError(message);
}

// ---- Reading ----------------------------------------------------------------------

namespace {

class TableReader final : public FieldVisitor {
 public:
  TableReader(std::string section, const toml::table& table, KeyPositions& positions, std::set<std::string>* auto_keys)
      : section_(std::move(section)), table_(table), positions_(positions), auto_keys_(auto_keys) {}

  /// Rejects every key of the table that no field visited.
  void reject_unknown_keys() const {
    for (const auto& [key, node] : table_) {
      if (std::find(known_.begin(), known_.end(), key.str()) == known_.end()) {
        throw_unknown_key(section_, key, known_);
      }
    }
  }

 protected:
  void on_integer(const char* key, std::int64_t& value, const Rule& rule, IntegerKind kind) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    if (!node->is_integer()) fail(key, *node, "an integer");
    const std::int64_t given = node->as_integer()->get();
    if (kind == IntegerKind::kInt32 &&
        (given < std::numeric_limits<int>::min() || given > std::numeric_limits<int>::max())) {
      fail(key, *node, std::string(rule.allowed) + " that fits in 32 bits");
    }
    if (!rule.accepts(static_cast<double>(given))) {
      fail(key, *node,
           std::string(rule.allowed) + (kind == IntegerKind::kInferred ? " (omit the key to have it inferred)" : ""));
    }
    value = given;
  }

  void on_number(const char* key, double& value, const Rule& rule) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    value = number_or_fail(key, *node, "a number", rule.allowed);
    if (!rule.accepts(value)) fail(key, *node, rule.allowed);
  }

  void on_number_pair(const char* key, std::array<double, 2>& value, const Rule& rule) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    const std::string expected = std::string("an array of 2 numbers, each ") + rule.allowed;
    const toml::array* array = node->as_array();
    if (array == nullptr || array->size() != 2) fail(key, *node, expected);
    std::array<double, 2> given{};
    for (std::size_t i = 0; i < 2; ++i) {
      given[i] = number_or_fail(key, *node, expected, expected, array->get(i));
      if (!rule.accepts(given[i])) fail(key, *node, expected);
    }
    value = given;
  }

  void on_boolean(const char* key, bool& value) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    if (!node->is_boolean()) fail(key, *node, "true or false");
    value = node->as_boolean()->get();
  }

  void on_text(const char* key, std::string& value) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    if (!node->is_string()) fail(key, *node, "a string");
    value = node->as_string()->get();
  }

  void on_text_list(const char* key, std::vector<std::string>& value) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    const toml::array* array = node->as_array();
    if (array == nullptr) fail(key, *node, "an array of strings");
    std::vector<std::string> given;
    for (const toml::node& element : *array) {
      if (!element.is_string() || element.as_string()->get().empty()) fail(key, *node, "an array of non-empty strings");
      given.push_back(element.as_string()->get());
    }
    value = std::move(given);
  }

  void on_choice(const char* key, std::size_t& index, const std::vector<const char*>& names) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    std::vector<std::string> spelled(names.begin(), names.end());
    std::vector<std::string> quoted;
    for (const std::string& name : spelled) quoted.push_back(quote(name));
    const std::string expected = "one of " + join(quoted, ", ");
    if (!node->is_string()) fail(key, *node, expected);
    const std::string& given = node->as_string()->get();
    const auto found = std::find(spelled.begin(), spelled.end(), given);
    if (found == spelled.end()) {
      const std::string suggestion = closest(given, spelled);
      fail(key, *node, expected + (suggestion.empty() ? "" : "; did you mean " + quote(suggestion) + "?"));
    }
    index = static_cast<std::size_t>(found - spelled.begin());
  }

  void on_choice_or_integers(const char* key,
                             std::size_t& index,
                             const std::vector<const char*>& names,
                             std::vector<std::int64_t>& integers) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    std::vector<std::string> quoted_names;
    for (std::size_t i = 0; i + 1 < names.size(); ++i) quoted_names.push_back(quote(names[i]));
    const std::string expected = "one of " + join(quoted_names, ", ") + ", or an array of integers";
    if (const toml::array* array = node->as_array()) {
      std::vector<std::int64_t> given;
      for (const toml::node& element : *array) {
        if (!element.is_integer()) fail(key, *node, expected);
        given.push_back(element.as_integer()->get());
      }
      integers = std::move(given);
      index = names.size() - 1;
      return;
    }
    if (!node->is_string()) fail(key, *node, expected);
    const std::string& given = node->as_string()->get();
    const std::vector<std::string> spelled(names.begin(), names.end() - 1);
    const auto found = std::find(spelled.begin(), spelled.end(), given);
    if (found == spelled.end()) {
      const std::string suggestion = closest(given, spelled);
      fail(key, *node, expected + (suggestion.empty() ? "" : "; did you mean " + quote(suggestion) + "?"));
    }
    index = static_cast<std::size_t>(found - spelled.begin());
    integers.clear();
  }

  void on_module_plan(const char* key, std::vector<TpPlanRule>& rules) override {
    const toml::node* node = find(key);
    if (node == nullptr) return;
    const toml::table* table = node->as_table();
    if (table == nullptr) fail(key, *node, "a table of module path globs, e.g. \"blocks.*.qkv\" = \"column\"");
    std::vector<std::string> styles;
    for (const auto& name : kTpStyleNames) styles.emplace_back(name.name);
    std::vector<TpPlanRule> given;
    for (const auto& [pattern, value] : *table) {
      const std::string rule_path = path(key) + "." + quote(std::string(pattern.str()));
      TpPlanRule rule;
      rule.pattern = std::string(pattern.str());
      rule.position = at(value.source());
      PARALLAX_CHECK(!rule.pattern.empty(), ConfigError, rule_path, rule.position,
                     ": an empty module path matches nothing");
      const toml::node* style = &value;
      if (const toml::table* options = value.as_table()) {
        style = options->get("style");
        PARALLAX_CHECK(style != nullptr, ConfigError, rule_path, rule.position,
                       ": a rule written as a table needs style = one of ", join(quoted(styles), ", "));
        for (const auto& [option, option_value] : *options) {
          const std::string name(option.str());
          if (name == "style") continue;
          if (name == "parts" || name == "heads") {
            const auto number = option_value.value<std::int64_t>();
            const bool ok = option_value.is_integer() && number && (name == "parts" ? *number >= 1 : *number >= 0);
            PARALLAX_CHECK(ok, ConfigError, rule_path, ".", name, " = ", render(option_value),
                           at(option_value.source()), ": expected an integer ", name == "parts" ? ">= 1" : ">= 0");
            (name == "parts" ? rule.parts : rule.heads) = *number;
          } else if (name == "gather_output") {
            PARALLAX_CHECK(option_value.is_boolean(), ConfigError, rule_path, ".gather_output = ", render(option_value),
                           at(option_value.source()), ": expected true or false");
            rule.gather_output = option_value.as_boolean()->get();
          } else {
            throw_unknown_key(rule_path, option, {"style", "parts", "heads", "gather_output"});
          }
        }
      }
      const auto* spelled = style->as_string();
      const auto found = spelled == nullptr ? styles.end() : std::find(styles.begin(), styles.end(), spelled->get());
      if (found == styles.end()) {
        const std::string suggestion = spelled == nullptr ? "" : closest(spelled->get(), styles);
        throw ConfigError(rule_path + " = " + render(*style) + at(style->source()) + ": expected one of " +
                          join(quoted(styles), ", ") +
                          (suggestion.empty() ? "" : "; did you mean " + quote(suggestion) + "?"));
      }
      rule.style = kTpStyleNames[found - styles.begin()].value;
      given.push_back(std::move(rule));
    }
    rules = std::move(given);
  }

 private:
  static std::vector<std::string> quoted(const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const std::string& name : names) out.push_back(quote(name));
    return out;
  }

  std::string path(const char* key) const { return section_ + "." + key; }

  // The key's node, or null when it is absent or "auto" on a layout key (the planner's:
  // recorded in the config's auto_keys, the field left at its default).
  const toml::node* find(const char* key) {
    known_.emplace_back(key);
    const toml::node* node = table_.get(key);
    if (node == nullptr) return nullptr;
    positions_[path(key)] = at(node->source());
    const auto& plannable = Config::plannable_keys();
    if (auto_keys_ != nullptr && node->is_string() && node->as_string()->get() == "auto" &&
        std::find(plannable.begin(), plannable.end(), path(key)) != plannable.end()) {
      auto_keys_->insert(path(key));
      return nullptr;
    }
    return node;
  }

  // The value of `element` (default: `node` itself) as a double; integers are
  // accepted where numbers are expected. Non-finite values are never meaningful here.
  double number_or_fail(const char* key,
                        const toml::node& node,
                        const std::string& type_expected,
                        const std::string& range_expected,
                        const toml::node* element = nullptr) {
    const toml::node& value = element != nullptr ? *element : node;
    double number = 0.0;
    if (value.is_integer()) {
      number = static_cast<double>(value.as_integer()->get());
    } else if (value.is_floating_point()) {
      number = value.as_floating_point()->get();
    } else {
      fail(key, node, type_expected);
    }
    if (!std::isfinite(number)) fail(key, node, "a finite number, " + range_expected);
    return number;
  }

  [[noreturn]] void fail(const char* key, const toml::node& node, const std::string& expected) const {
    throw ConfigError(path(key) + " = " + render(node) + at(node.source()) + ": expected " + expected);
  }

  std::string section_;
  const toml::table& table_;
  KeyPositions& positions_;
  std::set<std::string>* auto_keys_;  // null where "auto" is not a value (engine tables)
  std::vector<std::string> known_;
};

// ---- Writing ----------------------------------------------------------------------

class TomlWriter final : public FieldVisitor {
 public:
  /// `auto_keys` (null for engine tables): the section's keys given as "auto", written so.
  TomlWriter(std::ostream& out, std::string section, const std::set<std::string>* auto_keys)
      : out_(out), section_(std::move(section)), auto_keys_(auto_keys) {}

 protected:
  void on_integer(const char* key, std::int64_t& value, const Rule&, IntegerKind kind) override {
    if (written_as_auto(key)) return;
    // An omitted batch value must stay omitted: writing 0 would not load back.
    if (kind == IntegerKind::kInferred && value == 0) {
      out_ << "# " << key << " = (inferred)\n";
    } else {
      out_ << key << " = " << value << "\n";
    }
  }
  void on_number(const char* key, double& value, const Rule&) override {
    out_ << key << " = " << format_double(value) << "\n";
  }
  void on_number_pair(const char* key, std::array<double, 2>& value, const Rule&) override {
    out_ << key << " = [" << format_double(value[0]) << ", " << format_double(value[1]) << "]\n";
  }
  void on_boolean(const char* key, bool& value) override { out_ << key << " = " << (value ? "true" : "false") << "\n"; }
  void on_text(const char* key, std::string& value) override { out_ << key << " = " << quote(value) << "\n"; }
  void on_text_list(const char* key, std::vector<std::string>& value) override {
    std::vector<std::string> quoted;
    for (const std::string& text : value) quoted.push_back(quote(text));
    out_ << key << " = [" << join(quoted, ", ") << "]\n";
  }
  void on_choice(const char* key, std::size_t& index, const std::vector<const char*>& names) override {
    if (written_as_auto(key)) return;
    out_ << key << " = " << quote(names[index]) << "\n";
  }
  void on_choice_or_integers(const char* key,
                             std::size_t& index,
                             const std::vector<const char*>& names,
                             std::vector<std::int64_t>& integers) override {
    if (index + 1 < names.size()) {
      out_ << key << " = " << quote(names[index]) << "\n";
      return;
    }
    std::vector<std::string> values;
    for (std::int64_t value : integers) values.push_back(std::to_string(value));
    out_ << key << " = [" << join(values, ", ") << "]\n";
  }
  // One inline table, so the rules stay inside the section whatever follows.
  void on_module_plan(const char* key, std::vector<TpPlanRule>& rules) override {
    std::vector<std::string> entries;
    for (const TpPlanRule& rule : rules) {
      std::string style = quote(to_string(rule.style));
      if (rule.parts != 1 || rule.heads != 0 || rule.gather_output) {
        style = "{ style = " + style + ", parts = " + std::to_string(rule.parts) +
                ", heads = " + std::to_string(rule.heads) +
                ", gather_output = " + (rule.gather_output ? "true" : "false") + " }";
      }
      entries.push_back(quote(rule.pattern) + " = " + style);
    }
    out_ << key << " = { " << join(entries, ", ") << " }\n";
  }

 private:
  bool written_as_auto(const char* key) {
    if (auto_keys_ == nullptr || auto_keys_->count(section_ + "." + key) == 0) return false;
    out_ << key << " = \"auto\"\n";
    return true;
  }

  std::ostream& out_;
  std::string section_;
  const std::set<std::string>* auto_keys_;
};

}  // namespace

void read_section(const SectionDef& section,
                  const toml::table& table,
                  Config& config,
                  KeyPositions& positions,
                  const std::string& path) {
  if (path.empty() || path == section.name) {
    TableReader reader(section.name, table, positions, &config.auto_keys);
    section.fields(reader, config);
    reader.reject_unknown_keys();
    return;
  }
  KeyPositions read;
  TableReader reader(path, table, read, nullptr);
  section.fields(reader, config);
  reader.reject_unknown_keys();
  for (auto& [key, position] : read) positions[section.name + key.substr(path.size())] = position;
}

void write_section(const SectionDef& section, const Config& config, std::ostream& out, const std::string& header) {
  // FieldVisitor hands out mutable references (the reader needs them); the writer
  // works on a copy so to_toml can take a const Config.
  Config scratch = config;
  const bool main_section = header.empty() || header == section.name;
  TomlWriter writer(out, section.name, main_section ? &config.auto_keys : nullptr);
  out << "[" << (header.empty() ? section.name : header) << "]\n";
  section.fields(writer, scratch);
}

}  // namespace parallax::detail

namespace parallax {

std::string closest_spelling(const std::string& word, const std::vector<std::string>& candidates) {
  return detail::closest(word, candidates);
}

}  // namespace parallax
