// parallax-matrix: prints the strategy matrix (planner/strategy_matrix.h) as the
// Markdown table the README holds between its strategy-matrix markers.
#include <cstdio>
#include <exception>

#include "parallax/core/error.h"

#include "parallax/runtime/program_flags.h"
#include "parallax/planner/strategy_matrix.h"

int main(int argc, char** argv) {
  parallax::ProgramHelp help;
  help.description = "Prints the strategy matrix: which products of tp, pp, dp, ZeRO, offload and backend run.";
  help.reads_config = false;
  help.usage = "Usage: parallax-matrix\n";
  parallax::answer_informational_flags(argc, argv, help);  // --help, --version
  try {
    PARALLAX_CHECK(argc <= 1, UsageError, "parallax-matrix takes no arguments (--help says what it does)");
    std::fputs(parallax::strategy_matrix_markdown().c_str(), stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallax-matrix: %s\n", e.what());
    return 1;
  }
}
