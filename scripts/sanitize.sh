#!/usr/bin/env bash
# Builds the suite under a sanitizer, in a build directory of its own, and runs it.
#   scripts/sanitize.sh asan [CTEST ARGS...]   AddressSanitizer + UndefinedBehaviorSanitizer
#       (Clang), in build-asan/: every unit and MPI test, the examples' tests among them.
#       Not the labels gpu (no GPU here), fuzz (scripts/fuzz.sh runs its harnesses under
#       ASan/UBSan already) and faults (their bounds are times, which a sanitizer's 2-3x
#       slowdown makes meaningless), nor install_consumer (below). Any report fails
#       the test it happens in: UBSan halts on its first error, ASan on any,
#       LeakSanitizer at exit.
#   scripts/sanitize.sh tsan [CTEST ARGS...]   ThreadSanitizer, in build-tsan/, over the
#       threads Parallax runs: the communicator's progress threads (comm_test), the
#       failure channel's listener (engine_contract_test, whose Runtime starts it), the
#       NVMe tier's I/O thread (offloaded_adam_test, offload_equivalence_test) and the
#       checkpoint's background saver (checkpoint_store_test).
# Reports from the libraries we do not build (Open MPI, hwloc, LibTorch, OpenMP) are
# suppressed by library, not by function, in tests/sanitizers/*.supp, each with its
# reason; a report whose racing accesses are in Parallax's own code is never suppressed.
# Takes long: a build of its own (about 16 min on 2 cores for asan), then the suite at a
# sanitizer's speed (asan on 2 cores: about 3.5 hours, 5-30x the plain suite's times; the
# 29 slowest tests took 90 min in all, matrix_equivalence np4 14 min, np8 24 min).
# Every test's timeout is multiplied by 4.
# Extra arguments go to ctest, e.g. scripts/sanitize.sh asan -R comm.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODE="${1:-asan}"
shift || true
# Before common.sh, which keeps a BUILD_DIR already set: never the main build's directory.
case "$MODE" in
  asan | tsan) export BUILD_DIR="${BUILD_DIR:-build-$MODE}" ;;
esac
source scripts/common.sh
SUPPRESSIONS="$PWD/tests/sanitizers"

ensure_dependencies
case "$MODE" in
  asan)
    flags="-fsanitize=address,undefined -fno-omit-frame-pointer -g1"
    targets=()
    # install_consumer builds a program against the installed package with the
    # consumer's own flags, which link no sanitizer runtime: it tests packaging, not memory.
    labels=(-LE 'gpu|fuzz|faults' -E '^install_consumer$')
    # Open MPI's memory hooks (the patcher component) intercept what ASan intercepts.
    # Its components stay loaded to the end (tests/sanitizers/keep_loaded.c: Open MPI 4.1
    # has no setting for it), so that what they allocated and never freed is named by
    # library (lsan.supp), not an "<unknown module>" after their dlclose; full (slow)
    # unwinding follows a stack through libraries built without frame pointers (glibc's
    # vasprintf called by Open MPI), and is kept to the 8 innermost frames, which hold
    # the allocating library: LibTorch's deep stacks made the default 30 slow
    # (deferred_construction_test: 122 s at 30 frames, 85 s at 12, 53 s at 6).
    mkdir -p "$BUILD_DIR"
    keep_loaded="$(cd "$BUILD_DIR" && pwd)/keep_loaded.so"
    cc -shared -fPIC -O2 -o "$keep_loaded" "$SUPPRESSIONS/keep_loaded.c"
    export LD_PRELOAD="$keep_loaded${LD_PRELOAD:+:$LD_PRELOAD}"
    export OMPI_MCA_memory=^patcher
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_odr_violation=0:fast_unwind_on_malloc=0:malloc_context_size=8${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export LSAN_OPTIONS="suppressions=$SUPPRESSIONS/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$SUPPRESSIONS/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    ;;
  tsan)
    flags="-fsanitize=thread -g1"
    tsan_tests=(comm_test engine_contract_test offloaded_adam_test offload_equivalence_test checkpoint_store_test)
    targets=(--target "${tsan_tests[@]}")
    labels=(-R "^($(IFS='|'; echo "${tsan_tests[*]}"))")
    # Only the components the tests use are opened (one node: shared memory), so none that
    # tsan.supp names is unloaded again (TSan stops when a suppressed library goes).
    export OMPI_MCA_memory=^patcher OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPPRESSIONS/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
    ;;
  *)
    echo "sanitize.sh: unknown mode $MODE (asan, tsan)" >&2
    exit 2
    ;;
esac

export CXX=clang++  # the sanitizers' flags are Clang's
configure_and_build -DPARALLAX_BUILD_TESTS=ON -DPARALLAX_BUILD_EXAMPLES=ON -DPARALLAX_BUILD_BENCHMARKS=OFF \
  -DPARALLAX_WITH_NCCL=OFF -DPARALLAX_MALLOC=system -DPARALLAX_TEST_TIMEOUT_SCALE=4 "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" \
  "-DCMAKE_SHARED_LINKER_FLAGS=$flags" -- "${targets[@]}"
prefer_cpu_openblas_kernels
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 2400 "${labels[@]}" "$@"
