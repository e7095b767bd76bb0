// The measured figures a test prints for people and for the documentation (README.md, docs/):
//   print_figure("stage %d: max loss difference %.3g\n", stage, worst);
// prints "[ figures  ] Suite.Test: stage 1: max loss difference 2e-07" on stdout, named
// after the running GoogleTest test, whichever rank prints it (ranks' lines interleave).
// scripts/readme_figures.py pastes these lines into those pages.
#pragma once

#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdio>
#include <string>

namespace parallax_test {

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline void
print_figure(const char* format, ...) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = test ? std::string(test->test_suite_name()) + "." + test->name() : "(no test)";
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  std::printf("[ figures  ] %s: %s", name.c_str(), text);
  std::fflush(stdout);
}

}  // namespace parallax_test
