// The configuration reference (config_reference(), docs/config.md) against the loader:
// the committed file is the generated text; the reference lists exactly the keys that
// to_toml writes and the loader accepts, each with a meaning; the guides' key tables
// name only keys the reference has, with its defaults. Mutants: a key added to a
// section's fields but not to docs/config.md (the file comparison), a guide's default
// that drifts (the table check), a reference row the loader refuses (the --set loads).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A Markdown table row's cells, trimmed ("| `a` | b |" → {"`a`", "b"}).
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line.substr(1));
  while (std::getline(in, cell, '|')) {
    const auto first = cell.find_first_not_of(' ');
    const auto last = cell.find_last_not_of(' ');
    out.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
  }
  return out;
}

std::string unquoted(std::string text) {
  if (text.size() >= 2 && text.front() == '`' && text.back() == '`') text = text.substr(1, text.size() - 2);
  return text;
}

// The reference's rows, "section.key" → cells (key, type, default, allowed, meaning).
std::map<std::string, std::vector<std::string>> reference_rows() {
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream in(config_reference());
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.rfind("## [", 0) == 0) section = line.substr(4, line.size() - 5);
    if (line.rfind("| `", 0) == 0) rows[section + "." + unquoted(cells(line)[0])] = cells(line);
  }
  return rows;
}

TEST(ConfigReference, TheCommittedFileIsTheGeneratedOne) {
  EXPECT_EQ(read_text(PARALLAX_SOURCE_DIR "/docs/config.md"), config_reference())
      << "docs/config.md is stale; regenerate it: build/examples/train_gpt --config-reference > docs/config.md";
}

TEST(ConfigReference, ListsExactlyTheKeysTheLoaderAcceptsEachWithAMeaning) {
  const auto rows = reference_rows();
  // What to_toml writes for the defaults (another visitor of the same fields), each key
  // loaded back through --set: the reader accepts it.
  std::set<std::string> written;
  std::istringstream toml(to_toml(Config{}));
  std::string line, section;
  while (std::getline(toml, line)) {
    if (line.rfind("[", 0) == 0) section = line.substr(1, line.size() - 2);
    if (line.empty() || line[0] == '[') continue;
    const bool inferred = line.rfind("# ", 0) == 0;
    const std::string assignment = inferred ? line.substr(2) : line;
    const std::string key = assignment.substr(0, assignment.find(" = "));
    const std::string value = inferred ? "8" : assignment.substr(assignment.find(" = ") + 3);
    written.insert(section + "." + key);
    EXPECT_NO_THROW(load_config({{}, {section + "." + key + "=" + value}})) << section << "." << key << "=" << value;
  }
  std::set<std::string> listed;
  for (const auto& [key, row] : rows) {
    listed.insert(key);
    ASSERT_EQ(row.size(), 5u) << key;
    EXPECT_FALSE(row[4].empty()) << key << " has no meaning";
  }
  EXPECT_EQ(listed, written);
  const std::vector<std::string> keys = config_keys();
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()), listed);
  EXPECT_THROW(load_config({{}, {"zero.stagee=1"}}), ConfigError);  // and nothing else is accepted
}

// The guides' "| `[section]` key | Default | Meaning |" tables (docs/zero-and-offload.md):
// every key is one the reference lists, with the reference's default (numbers compared
// as numbers).
TEST(ConfigReference, TheGuidesKeyTablesAgreeWithIt) {
  const auto rows = reference_rows();
  std::istringstream readme(read_text(PARALLAX_SOURCE_DIR "/docs/zero-and-offload.md"));
  std::string line, section;
  int checked = 0;
  while (std::getline(readme, line)) {
    if (line.rfind("| `[", 0) == 0 && line.find("` key |") != std::string::npos) {
      section = line.substr(4, line.find(']') - 4);
      continue;
    }
    if (section.empty() || line.rfind("|", 0) != 0) {
      section.clear();
      continue;
    }
    if (line.rfind("| `", 0) != 0) continue;  // the |---| line
    const std::vector<std::string> row = cells(line);
    const std::string key = section + "." + unquoted(row[0]);
    const auto found = rows.find(key);
    ASSERT_NE(found, rows.end()) << "the guide lists " << key << ", which the loader does not read";
    const std::string want = unquoted(found->second[2]);
    const std::string got = unquoted(row[1]);
    char* end = nullptr;
    const double number = std::strtod(got.c_str(), &end);
    if (!got.empty() && *end == '\0') {
      EXPECT_EQ(number, std::strtod(want.c_str(), nullptr)) << key << ": the guide says " << got << ", the code " << want;
    } else {
      EXPECT_EQ(got, want) << key;
    }
    ++checked;
  }
  EXPECT_GE(checked, 16);  // [zero]'s 10 and [offload]'s 6
}

}  // namespace
}  // namespace parallax
