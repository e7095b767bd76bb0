#!/usr/bin/env bash
# Installs what is missing, builds everything (Release, into $BUILD_DIR) and runs the whole
# CTest suite except the tests labelled "gpu". Extra arguments go to ctest, e.g.
#   scripts/test.sh -R config_test
#   TORCH=wheel scripts/test.sh       against LibTorch 2.11 from PyPI, in build-wheel/
#   PARALLAX_BUILD_BENCHMARKS=OFF scripts/test.sh   without the benchmarks (no test runs them)
#   PARALLAX_TEST_EXCLUDE='gpu|fuzz' scripts/test.sh  without the labels matched (default: gpu)
# (scripts/common.sh says what TORCH selects).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/common.sh

ensure_dependencies
# With a CUDA toolkit on the PATH, the NCCL communicator must compile and link (nothing
# runs it without a GPU); otherwise it is built only when LibTorch has CUDA.
nccl=AUTO
if command -v nvcc >/dev/null; then nccl=ON; fi
configure_and_build -DPARALLAX_BUILD_TESTS=ON -DPARALLAX_BUILD_EXAMPLES=ON \
  -DPARALLAX_BUILD_BENCHMARKS="${PARALLAX_BUILD_BENCHMARKS:-ON}" -DPARALLAX_WITH_NCCL="$nccl"
cd "$BUILD_DIR"
# PARALLAX_TEST_EXCLUDE: the labels left out (a regex; default "gpu"). The fuzzers (label
# "fuzz") use neither LibTorch, so CI runs them in its first pass only. Tests run side by
# side on every core (PARALLAX_TEST_JOBS to change it): each declares the processors it
# uses (its ranks), CTest never runs more at once than there are, and a test of more ranks
# than cores runs alone; none depends on time, and the fuzzers share build-fuzz/ by a lock.
ctest --output-on-failure --timeout 600 -j"${PARALLAX_TEST_JOBS:-$(nproc)}" -LE "${PARALLAX_TEST_EXCLUDE:-gpu}" "$@"
