// parallax-matrix: prints the strategy matrix (runtime/strategy_matrix.h) as the
// Markdown table the README holds between its strategy-matrix markers.
#include <cstdio>
#include <exception>

#include "parallax/runtime/strategy_matrix.h"

int main() {
  try {
    std::fputs(parallax::strategy_matrix_markdown().c_str(), stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallax-matrix: %s\n", e.what());
    return 1;
  }
}
