#!/usr/bin/env bash
# Formats the sources with clang-format (in place, or --check to only report) and runs
# clang-tidy over the library sources using the build's compile_commands.json.
# Usage: scripts/lint.sh [--check]   (BUILD_DIR defaults to build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
mapfile -t sources < <(git ls-files '*.h' '*.cpp')
if [ "${1:-}" = "--check" ]; then
  clang-format --dry-run --Werror "${sources[@]}"
else
  clang-format -i "${sources[@]}"
fi
if [ -f "$build_dir/compile_commands.json" ]; then
  mapfile -t library < <(git ls-files 'core/*.cpp' 'zero/*.cpp' 'offload/*.cpp' 'tensor_parallel/*.cpp' 'pipeline/*.cpp' 'runtime/*.cpp')
  clang-tidy -p "$build_dir" --quiet "${library[@]}"
else
  echo "lint: no $build_dir/compile_commands.json; configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON for clang-tidy" >&2
fi
