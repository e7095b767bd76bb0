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
ensure_test_python
# With a CUDA toolkit on the PATH, the NCCL communicator must compile and link (nothing
# runs it without a GPU); otherwise it is built only when LibTorch has CUDA.
nccl=AUTO
if command -v nvcc >/dev/null; then nccl=ON; fi
configure_and_build -DPARALLAX_BUILD_TESTS=ON -DPARALLAX_BUILD_EXAMPLES=ON \
  -DPARALLAX_BUILD_BENCHMARKS="${PARALLAX_BUILD_BENCHMARKS:-ON}" -DPARALLAX_WITH_NCCL="$nccl" \
  -DPARALLAX_TEST_PYTHON="$PARALLAX_TEST_PYTHON"
root=$PWD
cd "$BUILD_DIR"
# PARALLAX_TEST_EXCLUDE: the labels left out (a regex; default "gpu": no device here).
# PARALLAX_TEST_LABELS: only the labels matched (a regex; default: every label), e.g.
# "versioned" for the tests whose code differs between LibTorch versions. Tests run side
# by side on every core (PARALLAX_TEST_JOBS to change it): each declares the processors
# it uses (its ranks), CTest never runs more at once than there are, and a test of more
# ranks than cores runs alone; none depends on time, and the fuzzers share build-fuzz/ by
# a lock.
# A skipped test is not a pass: the summary lists each with its reason, and with
# PARALLAX_FAIL_ON_SKIP=1 (CI sets it) a skip fails the run.
junit="$PWD/parallax-junit.xml"
rm -f "$junit"
status=0
ctest --output-on-failure --timeout 600 -j"${PARALLAX_TEST_JOBS:-$(nproc)}" -LE "${PARALLAX_TEST_EXCLUDE:-gpu}" \
  ${PARALLAX_TEST_LABELS:+-L "$PARALLAX_TEST_LABELS"} --output-junit "$junit" "$@" || status=$?
skipped=""
if [[ -f "$junit" ]]; then
  skipped=$(python3 "$root/scripts/ctest_skips.py" "$junit") || { echo "test.sh: cannot list the skipped tests" >&2; status=1; }
elif ((status == 0)); then
  echo "test.sh: ctest wrote no $junit" >&2
  status=1
fi
if [[ -n "$skipped" ]]; then
  echo "Skipped (a skip is not a pass; install what each needs):"
  sed 's/^/  /' <<<"$skipped"
  if [[ "${PARALLAX_FAIL_ON_SKIP:-0}" == 1 ]]; then
    echo "test.sh: $(wc -l <<<"$skipped") test(s) skipped, and PARALLAX_FAIL_ON_SKIP=1" >&2
    status=1
  fi
else
  echo "Skipped: none"
fi
exit "$status"
