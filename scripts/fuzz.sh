#!/usr/bin/env bash
# Fuzzes the parsers of outside input with libFuzzer (Debian's clang, with
# AddressSanitizer and UndefinedBehaviorSanitizer): builds each harness of tests/fuzz/
# (in build-fuzz/, or FUZZ_BUILD_DIR), replays its committed regression inputs, then
# fuzzes it for SECONDS (default 60) starting from its committed seed corpus. Exits
# non-zero on a crash, hang (> 5 s per input), out-of-memory (> 2 GB), leak or sanitizer
# report; the input that caused it is left in tests/fuzz/findings/. A finding becomes a
# regression once fixed: move it to tests/fuzz/regressions/<harness>/ (keeping
# libFuzzer's name, e.g. oom-<sha1>, prefixed by the harness), add the unit test that
# names the bug, and `scripts/fuzz.sh replay <harness>` passes.
#
#   scripts/fuzz.sh [SECONDS [HARNESS...]]   a campaign: explores for SECONDS each
#   scripts/fuzz.sh replay [HARNESS...]      what the test suite runs (label fuzz): the
#       regressions, every committed corpus input, then FUZZ_RUNS (default 50000)
#       executions from seed 1: the same inputs every time, so it fails only on those
# Harnesses (default: all): manifest (checkpoint/manifest.h's parse_manifest), config
# (core/config_loader.h's load_config with --set overrides and extends, then to_toml's
# round trip and Config::resolve), topology (core/topology.h's synthetic
# descriptions and a peer's serialized NodeTopology; topology_xml, not in the default
# list, adds hwloc XML files), transfer_meta (the pipeline
# transport's header and TransferMeta, pipeline/transfer_meta.h).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODE=explore
if [[ "${1:-}" == replay ]]; then
  MODE=replay
  shift
else
  SECONDS_EACH="${1:-60}"
  shift || true
fi
RUNS="${FUZZ_RUNS:-50000}"
HARNESSES=("$@")
[[ ${#HARNESSES[@]} -gt 0 ]] || HARNESSES=(manifest config topology transfer_meta)
CXX="${FUZZ_CXX:-clang++}"
command -v "$CXX" >/dev/null || { echo "fuzz.sh: $CXX not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
# The harnesses are built in a directory that stays, with fixed paths, and each source
# is compiled on its own, so that ccache (when installed) reuses the objects of an
# earlier run: the build, not the fuzzing, was most of the fuzz label's time in CI.
OUT="${FUZZ_BUILD_DIR:-$PWD/build-fuzz}"
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(ccache)

# Generated protobuf sources and the "parallax/..." include root, as the CMake build has
# them; regenerated only when a .proto changed, so that their headers keep their times.
mkdir -p "$OUT/include"
ln -sfn "$PWD" "$OUT/include/parallax"
for proto in proto/checkpoint.proto proto/topology.proto proto/pipeline.proto; do
  if [[ "$proto" -nt "$OUT/include/${proto%.proto}.pb.cc" ]]; then protoc --cpp_out="$OUT/include" "$proto"; fi
done

flags=(-std=c++17 -g -O1 "-fsanitize=fuzzer,address,undefined" -fno-sanitize-recover=undefined -I"$OUT/include")
# link NAME "SOURCES..." LIBS...: compiles each source (with the caller's extra flags) to
# an object of its own under $OUT/NAME/, then links them into $OUT/NAME/fuzzer.
link() {
  local name="$1" sources="$2" objects=() source object
  shift 2
  mkdir -p "$OUT/$name"
  for source in $sources; do
    object="$OUT/$name/$(basename "${source%.*}").o"
    "${LAUNCHER[@]}" "$CXX" "${flags[@]}" "${extra[@]}" -c "$source" -o "$object"
    objects+=("$object")
  done
  "$CXX" "${flags[@]}" -o "$OUT/$name/fuzzer" "${objects[@]}" "$@"
}
build() {
  local extra=()
  case "$1" in
    manifest)
      link manifest "tests/fuzz/manifest_fuzzer.cpp checkpoint/manifest.cpp core/error.cpp
        $OUT/include/proto/checkpoint.pb.cc" -lprotobuf -lpthread
      ;;
    config)
      link config "tests/fuzz/config_fuzzer.cpp core/config.cpp core/config_loader.cpp
        core/config_fields.cpp core/config_sections.cpp core/config_checks.cpp core/config_engines.cpp core/config_reference.cpp
        core/app_table.cpp core/error.cpp core/logging.cpp" -lpthread
      ;;
    topology | topology_xml)
      # topology_xml also mutates hwloc XML: it fuzzes hwloc's importer, which Debian's
      # hwloc 2.9.0 crashes in on crafted files (tests/fuzz/topology_fuzzer.cpp says which).
      [[ $1 == topology_xml ]] && extra=(-DPARALLAX_FUZZ_HWLOC_XML)
      link "$1" "tests/fuzz/topology_fuzzer.cpp core/topology.cpp core/synthetic_description.cpp core/error.cpp core/logging.cpp
        $OUT/include/proto/topology.pb.cc" -lhwloc -lprotobuf -lpthread
      ;;
    transfer_meta)
      # c10 alone (ScalarType): the harness links none of LibTorch's tensor libraries.
      link transfer_meta "tests/fuzz/transfer_meta_fuzzer.cpp pipeline/transfer_meta.cpp core/error.cpp
        $OUT/include/proto/pipeline.pb.cc" -lc10 -lprotobuf -lpthread
      ;;
    *)
      echo "fuzz.sh: unknown harness $1 (manifest, config, topology, topology_xml, transfer_meta)" >&2
      exit 2
      ;;
  esac
}

# Leaks inside libraries we do not build (tests/fuzz/lsan.supp says which, and why).
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# fuzz HARNESS: replay its regressions, then fuzz it from its seed corpus.
fuzz() {
  local harness="$1" fuzzer runs regressions
  fuzzer="$OUT/$harness/fuzzer"
  regressions=(tests/fuzz/regressions/"$harness"/*)
  if [[ -e "${regressions[0]}" ]]; then
    "$fuzzer" "${regressions[@]}" 2>"$WORK/replay.log" || { cat "$WORK/replay.log"; exit 1; }
    echo "fuzz: $harness: ${#regressions[@]} regression input(s) pass"
  fi
  mkdir -p "$WORK/corpus-$harness" tests/fuzz/findings
  if ! "$fuzzer" -max_total_time="$SECONDS_EACH" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix=tests/fuzz/findings/"$harness"- "$WORK/corpus-$harness" tests/fuzz/corpus/"$harness" 2>"$WORK/fuzz.log"; then
    tail -n 60 "$WORK/fuzz.log"
    echo "fuzz: $harness: a finding, kept in tests/fuzz/findings/" >&2
    exit 1
  fi
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$WORK/fuzz.log")"
  echo "[ figures  ] fuzz $harness: $runs executions in $SECONDS_EACH s, no finding"
}

# replay HARNESS: its regressions and committed corpus, then RUNS executions from seed 1
# (a fixed sequence of inputs: libFuzzer's mutations depend only on the seed, the binary
# and its coverage), with bounds far from any input's normal cost.
replay() {
  local harness="$1" fuzzer input inputs
  fuzzer="$OUT/$harness/fuzzer"
  inputs=()
  for input in tests/fuzz/regressions/"$harness"/* tests/fuzz/corpus/"$harness"/*; do
    [[ -f "$input" ]] && inputs+=("$input")
  done
  "$fuzzer" -timeout=60 -rss_limit_mb=2048 "${inputs[@]}" 2>"$WORK/replay.log" || { cat "$WORK/replay.log"; exit 1; }
  mkdir -p "$WORK/corpus-$harness"
  if ! "$fuzzer" -seed=1 -runs="$RUNS" -timeout=60 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$WORK/$harness-" "$WORK/corpus-$harness" tests/fuzz/corpus/"$harness" 2>"$WORK/fuzz.log"; then
    tail -n 60 "$WORK/fuzz.log"
    echo "fuzz: $harness: seed 1 found an input that fails (above); run scripts/fuzz.sh 60 $harness to keep it" >&2
    exit 1
  fi
  echo "[ figures  ] fuzz $harness: ${#inputs[@]} regression and corpus inputs, then $RUNS executions from seed 1, no finding"
}

for harness in "${HARNESSES[@]}"; do
  build "$harness"
  if [[ $MODE == replay ]]; then replay "$harness"; else fuzz "$harness"; fi
done
