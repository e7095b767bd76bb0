// parallax: the command-line tool, git-style. Offline: no MPI, no GPU, no LibTorch.
//   parallax plan ...         the planner (plan_command.cpp)
//   parallax matrix           the strategy matrix as the README's Markdown table
//   parallax checkpoint ...   runs parallax_checkpoint (which links LibTorch): the one
//                             beside this executable (an installed bin/), else the build's
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "plan_command.h"
#include "parallax/core/error.h"
#include "parallax/planner/strategy_matrix.h"

namespace {

constexpr const char* kUsage =
    "Usage: parallax <command> [options]\n"
    "\n"
    "Commands:\n"
    "  plan     choose tp, pp, dp, ZeRO, offload, schedule and micro-batch for a model on a cluster,\n"
    "           or score one layout (parallax plan --help)\n"
    "  matrix   print the strategy matrix: which products of tp, pp, ZeRO and offload run\n"
    "  checkpoint info|export|convert ...   inspect, export and convert checkpoints\n"
    "\n"
    "parallax --version prints the version.\n";

// parallax_checkpoint beside this executable, else the one this build made.
std::string checkpoint_tool() {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length > 0) {
    std::string path(self, static_cast<std::size_t>(length));
    path = path.substr(0, path.rfind('/') + 1) + "parallax_checkpoint";
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return PARALLAX_CHECKPOINT_TOOL;
}

}  // namespace

using parallax::UsageError;

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("parallax %s\n", PARALLAX_VERSION);
    return 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    if (args[0] == "plan") return parallax::cli::plan_command(rest);
    if (args[0] == "checkpoint") {
      const std::string tool = checkpoint_tool();
      std::vector<char*> tool_argv{const_cast<char*>(tool.c_str())};
      for (int i = 2; i < argc; ++i) tool_argv.push_back(argv[i]);
      tool_argv.push_back(nullptr);
      execv(tool.c_str(), tool_argv.data());
      std::fprintf(stderr, "parallax checkpoint: cannot run %s: %s\n", tool.c_str(), std::strerror(errno));
      return 1;
    }
    if (args[0] == "matrix") {
      if (!rest.empty() && (rest[0] == "--help" || rest[0] == "-h")) {
        std::puts("Usage: parallax matrix\nPrints the strategy matrix as a Markdown table (each cell loaded by the "
                  "real config loader and checked by strategy_refusals).");
        return 0;
      }
      PARALLAX_CHECK(rest.empty(), UsageError, "parallax matrix takes no arguments");
      std::fputs(parallax::strategy_matrix_markdown().c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "parallax: unknown command '%s'\n\n%s", args[0].c_str(), kUsage);
    return 2;
  } catch (const parallax::Error& e) {
    std::fprintf(stderr, "parallax %s: %s: %s\n", args[0].c_str(), e.kind().c_str(), e.detail().c_str());
    return e.kind() == "UsageError" ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallax %s: %s\n", args[0].c_str(), e.what());
    return 1;
  }
}
