// libFuzzer harness: a config is outside input (TOML files, --set overrides, the files
// they extend). The input is split at its first "\n---\n": the part before is --set
// overrides, one per line; the part after is main.toml, written into a directory that
// also holds base.toml (a valid config main.toml may `extends`, as may base.toml itself,
// making a cycle when main.toml extends itself). load_config must return a Config or
// throw ConfigError/UsageError: never crash, hang, leak or throw anything else. A loaded
// config must then resolve for 4 ranks or throw ConfigError, and what to_toml prints
// must load back to the same text (the printed config is what every rank hashes). The
// engines "generator" and "discriminator" may have [engine.<name>] tables.
// Built and run by scripts/fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "parallax/core/config.h"
#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace {

const std::string& directory() {
  static const std::string path = [] {
    char pattern[] = "/tmp/parallax_config_fuzz.XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (made == nullptr) std::abort();
    std::ofstream(std::string(made) + "/base.toml") << "[train]\nglobal_batch_size = 32\nsteps = 3\n"
                                                       "[zero]\nstage = 1\n[model]\nwidth = 8\n";
    return std::string(made);
  }();
  return path;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t split = input.find("\n---\n");
  const std::string overrides = split == std::string::npos ? "" : input.substr(0, split);
  const std::string document = split == std::string::npos ? input : input.substr(split + 5);
  parallax::ConfigSources sources;
  sources.files.push_back(directory() + "/main.toml");
  write(sources.files.back(), document);
  std::size_t begin = 0;
  while (begin < overrides.size()) {
    const std::size_t end = std::min(overrides.find('\n', begin), overrides.size());
    sources.overrides.push_back(overrides.substr(begin, end - begin));
    begin = end + 1;
  }
  const parallax::LoadOptions options{{"model", "data"}, {"generator", "discriminator"}};
  parallax::Config config;
  try {
    config = parallax::load_config(sources, options);
  } catch (const parallax::ConfigError&) {
    return 0;
  } catch (const parallax::UsageError&) {
    return 0;
  }
  // What every rank prints and hashes loads back to itself.
  const std::string printed = parallax::to_toml(config);
  write(directory() + "/printed.toml", printed);
  const parallax::Config again = parallax::load_config({{directory() + "/printed.toml"}, {}}, options);
  if (parallax::to_toml(again) != printed) {
    std::fprintf(stderr, "to_toml does not load back to itself:\n%s\n---\n%s\n", printed.c_str(),
                 parallax::to_toml(again).c_str());
    std::abort();
  }
  try {
    config.resolve(4);
  } catch (const parallax::ConfigError&) {
  }
  return 0;
}
