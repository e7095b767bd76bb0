// AppTable: typed, position-aware access to a table the application owns ([model],
// [data]). Errors name the key path and the file position, like the loader's own.
#include <algorithm>

#include "parallax/core/config.h"
#include "parallax/core/config_toml.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

using detail::at;

std::string path_of(const AppTable::Impl& impl, const std::string& key) {
  return impl.name + "." + key;
}

/// The node at `key` (dotted keys reach into sub-tables), or null.
const toml::node* find(const AppTable::Impl& impl, const std::string& key) {
  const toml::node* node = &impl.table;
  std::string::size_type start = 0;
  while (node != nullptr) {
    const toml::table* table = node->as_table();
    if (table == nullptr) return nullptr;
    const auto dot = key.find('.', start);
    node = table->get(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node;
}

const toml::node& require(const AppTable::Impl& impl, const std::string& key) {
  const toml::node* node = find(impl, key);
  PARALLAX_CHECK(node != nullptr, ConfigError, path_of(impl, key), " is required but missing from [", impl.name, "]",
                 at(impl.table.source()));
  return *node;
}

[[noreturn]] void wrong_type(const AppTable::Impl& impl,
                             const std::string& key,
                             const toml::node& node,
                             const char* expected) {
  throw ConfigError(path_of(impl, key) + " = " + detail::render(node) + at(node.source()) + ": expected " + expected);
}

std::int64_t as_int(const AppTable::Impl& impl, const std::string& key, const toml::node& node) {
  if (!node.is_integer()) wrong_type(impl, key, node, "an integer");
  return node.as_integer()->get();
}

double as_double(const AppTable::Impl& impl, const std::string& key, const toml::node& node) {
  // Integers are accepted where numbers are expected, as in the Parallax sections.
  if (node.is_integer()) return static_cast<double>(node.as_integer()->get());
  if (!node.is_floating_point()) wrong_type(impl, key, node, "a number");
  return node.as_floating_point()->get();
}

bool as_bool(const AppTable::Impl& impl, const std::string& key, const toml::node& node) {
  if (!node.is_boolean()) wrong_type(impl, key, node, "true or false");
  return node.as_boolean()->get();
}

std::string as_string(const AppTable::Impl& impl, const std::string& key, const toml::node& node) {
  if (!node.is_string()) wrong_type(impl, key, node, "a string");
  return node.as_string()->get();
}

}  // namespace

AppTable::AppTable(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {
  PARALLAX_ASSERT(impl_ != nullptr, "AppTable needs a table");
}

const std::string& AppTable::name() const {
  return impl_->name;
}

bool AppTable::contains(const std::string& key) const {
  return find(*impl_, key) != nullptr;
}

std::int64_t AppTable::get_int(const std::string& key) const {
  return as_int(*impl_, key, require(*impl_, key));
}

std::int64_t AppTable::get_int(const std::string& key, std::int64_t fallback) const {
  const toml::node* node = find(*impl_, key);
  return node == nullptr ? fallback : as_int(*impl_, key, *node);
}

double AppTable::get_double(const std::string& key) const {
  return as_double(*impl_, key, require(*impl_, key));
}

double AppTable::get_double(const std::string& key, double fallback) const {
  const toml::node* node = find(*impl_, key);
  return node == nullptr ? fallback : as_double(*impl_, key, *node);
}

bool AppTable::get_bool(const std::string& key, bool fallback) const {
  const toml::node* node = find(*impl_, key);
  return node == nullptr ? fallback : as_bool(*impl_, key, *node);
}

std::string AppTable::get_string(const std::string& key) const {
  return as_string(*impl_, key, require(*impl_, key));
}

std::string AppTable::get_string(const std::string& key, const std::string& fallback) const {
  const toml::node* node = find(*impl_, key);
  return node == nullptr ? fallback : as_string(*impl_, key, *node);
}

void AppTable::expect_only(const std::vector<std::string>& allowed) const {
  for (const auto& [key, node] : impl_->table) {
    if (std::find(allowed.begin(), allowed.end(), key.str()) == allowed.end()) {
      detail::throw_unknown_key(impl_->name, key, allowed);
    }
  }
}

const AppTable& Config::app_table(const std::string& name) const {
  const auto found = app.find(name);
  if (found == app.end()) {
    std::string read;
    for (const std::string& source : sources) read += (read.empty() ? "" : ", ") + source;
    throw ConfigError("the config has no [" + name + "] table" +
                      (read.empty() ? std::string(" (no config file was given)") : " (files read: " + read + ")"));
  }
  return found->second;
}

}  // namespace parallax
