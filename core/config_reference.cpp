// The configuration reference (docs/config.md), generated from the same section table
// the loader reads through (config_sections.cpp): each key's type, default, allowed
// values and meaning come from its one FieldVisitor call, so the reference cannot list
// a key the loader refuses or miss one it accepts.
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/config_toml.h"

namespace parallax {
namespace detail {
namespace {

std::string quoted_names(const std::vector<const char*>& names, std::size_t count) {
  std::vector<std::string> quoted;
  for (std::size_t i = 0; i < count; ++i) quoted.push_back(quote(names[i]));
  return join(quoted, ", ");
}

// One table row per key: | `key` | type | default | allowed | meaning |.
class ReferenceWriter final : public FieldVisitor {
 public:
  explicit ReferenceWriter(std::ostream& out) : out_(out) {}

 protected:
  void on_integer(const char* key, std::int64_t& value, const Rule& rule, IntegerKind kind) override {
    row(key, "integer", kind == IntegerKind::kInferred && value == 0 ? "inferred" : code(std::to_string(value)),
        rule.allowed);
  }
  void on_number(const char* key, double& value, const Rule& rule) override {
    row(key, "number", code(format_double(value)), rule.allowed);
  }
  void on_number_pair(const char* key, std::array<double, 2>& value, const Rule& rule) override {
    row(key, "[number, number]", code("[" + format_double(value[0]) + ", " + format_double(value[1]) + "]"),
        std::string("each ") + rule.allowed);
  }
  void on_boolean(const char* key, bool& value) override {
    row(key, "boolean", code(value ? "true" : "false"), "true, false");
  }
  void on_text(const char* key, std::string& value) override { row(key, "string", code(quote(value)), "a string"); }
  void on_text_list(const char* key, std::vector<std::string>& value) override {
    std::vector<std::string> quoted;
    for (const std::string& text : value) quoted.push_back(quote(text));
    row(key, "array of strings", code("[" + join(quoted, ", ") + "]"), "strings");
  }
  void on_choice(const char* key, std::size_t& index, const std::vector<const char*>& names) override {
    row(key, "string", code(quote(names[index])), quoted_names(names, names.size()));
  }
  void on_choice_or_integers(const char* key,
                             std::size_t& index,
                             const std::vector<const char*>& names,
                             std::vector<std::int64_t>& integers) override {
    row(key, "string or array of integers", code(quote(names[index])),
        quoted_names(names, names.size() - 1) + ", or [" + names.back() + "]");
  }
  void on_module_plan(const char* key, std::vector<TpPlanRule>& rules) override {
    row(key, "table", code("{}"),
        "module path glob = style, or { style, parts, heads, gather_output }; styles: " +
            join({"\"column\"", "\"row\"", "\"vocab_embedding\"", "\"vocab_output\"", "\"replicate\""}, ", "));
  }

 private:
  static std::string code(const std::string& text) { return "`" + text + "`"; }
  void row(const char* key, const std::string& type, const std::string& value, const std::string& allowed) {
    out_ << "| `" << key << "` | " << type << " | " << value << " | " << allowed << " | " << meaning() << " |\n";
  }
  std::ostream& out_;
};

// Every key's name, for config_keys().
class KeyCollector final : public FieldVisitor {
 public:
  KeyCollector(std::string section, std::vector<std::string>& keys) : section_(std::move(section)), keys_(keys) {}

 protected:
  void on_integer(const char* key, std::int64_t&, const Rule&, IntegerKind) override { add(key); }
  void on_number(const char* key, double&, const Rule&) override { add(key); }
  void on_number_pair(const char* key, std::array<double, 2>&, const Rule&) override { add(key); }
  void on_boolean(const char* key, bool&) override { add(key); }
  void on_text(const char* key, std::string&) override { add(key); }
  void on_text_list(const char* key, std::vector<std::string>&) override { add(key); }
  void on_choice(const char* key, std::size_t&, const std::vector<const char*>&) override { add(key); }
  void on_choice_or_integers(const char* key,
                             std::size_t&,
                             const std::vector<const char*>&,
                             std::vector<std::int64_t>&) override {
    add(key);
  }
  void on_module_plan(const char* key, std::vector<TpPlanRule>&) override { add(key); }

 private:
  void add(const char* key) { keys_.push_back(section_ + "." + key); }
  std::string section_;
  std::vector<std::string>& keys_;
};

}  // namespace
}  // namespace detail

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  Config scratch;
  for (const detail::SectionDef& section : detail::sections()) {
    detail::KeyCollector collector(section.name, keys);
    section.fields(collector, scratch);
  }
  return keys;
}

std::string config_reference() {
  std::ostringstream out;
  out << "# Configuration reference\n\n"
         "Every key Parallax reads, by section. This file is generated from the loader's own field table "
         "(`core/config_sections.cpp`): print it with any Parallax program's `--config-reference`; "
         "`config_test` fails when the two differ.\n\n"
         "A configuration is read from `--config FILE` (repeatable: a later file overrides an earlier "
         "one; a file may `extends = \"base.toml\"` or a list of files, found relative to it) and then "
         "`--set section.key=VALUE` overrides, VALUE in TOML syntax (`--set zero.stage=3`, "
         "`--set 'offload.nvme_path=\"/tmp\"'`). Every key may be omitted and keeps its default. An "
         "unknown key or table, a wrong type or a value outside what is allowed is an error naming the "
         "file, line and column, with a \"did you mean\"; tables the application declares (the "
         "examples' `[model]` and `[data]`) are its own.\n";
  Config defaults;
  for (const detail::SectionDef& section : detail::sections()) {
    out << "\n## [" << section.name << "]\n\n" << section.about << "\n\n";
    out << "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
    detail::ReferenceWriter writer(out);
    section.fields(writer, defaults);
  }
  out << "\n## [engine.<name>]\n\n"
         "A program with several models (a GAN's generator and discriminator) builds one engine per model, "
         "each with a name it declares (`InitOptions::engines`, `EngineOptions(name)`). The table "
         "`[engine.<name>]` gives that engine options of its own over the run's: `grad_accum` (its "
         "micro-batches per optimizer step; its global batch is then `micro_batch_size x grad_accum x dp`), "
         "and the tables `[engine.<name>.zero]`, `[engine.<name>.offload]` and `[engine.<name>.precision]`, "
         "with the keys of `[zero]`, `[offload]` and `[precision]` above, each key over the run's. Every "
         "engine shares the rest: the degrees and mesh, the micro-batch per rank, the optimizer keys, "
         "checkpoints (a named engine's go under `checkpoint.dir/<name>`). A table for a name the program "
         "did not declare, or any other key, is an error; each engine's combination is checked by the "
         "same rules as the run's (`--set engine.generator.zero.stage=3`).\n";
  return out.str();
}

}  // namespace parallax
