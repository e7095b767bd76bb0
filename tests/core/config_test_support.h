// The config tests' shared fixture: a scratch directory per test, files written into
// it, and the message of the ConfigError a load throws.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax::config_testing {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, needle) EXPECT_NE(std::string(text).find(needle), std::string::npos) << "in: " << (text)

// The detail() of the E thrown by `f`, or "" (and a test failure) if none is thrown.
template <typename E = ConfigError>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.detail();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("parallax_config_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to `name` under the test's directory; returns the path.
  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path.string();
  }
  Config load(const std::vector<std::string>& files,
              const std::vector<std::string>& sets = {},
              const std::vector<std::string>& app_tables = {}) {
    return load_config(ConfigSources{files, sets}, LoadOptions{app_tables});
  }
  // The error of loading one file with `text`, and its path in `path`.
  std::string load_error(const std::string& text, std::string* path = nullptr) {
    const std::string file = write("a.toml", text);
    if (path != nullptr) *path = file;
    return error_of([&] { load({file}); });
  }

  fs::path dir_;
};

}  // namespace parallax::config_testing
