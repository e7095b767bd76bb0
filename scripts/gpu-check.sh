#!/usr/bin/env bash
# One prepared run on the GPU machine that `device` lends some tasks (PyTorch 2.11 with
# CUDA, nvcc, CMake and ninja there; no Open MPI, TOML++, Protobuf or hwloc, and no
# network), and the same run on a CPU machine, so that it cannot rot.
#
#   scripts/gpu-check.sh fetch
#       Here, with network: downloads the Debian packages Parallax builds against
#       (Open MPI, TOML++, Protobuf, hwloc, GoogleTest, pkgconf; about 12 MB) into
#       .gpu-check/debs, which git ignores. Carry that folder to the GPU machine.
#   scripts/gpu-check.sh run [--cpu] [--out FILE]
#       There: unpacks the packages into a prefix (dpkg -x, nothing installed), builds
#       Parallax against them and the machine's own torch (`python3`, or $PYTHON), checks
#       that the build found every dependency in the prefix, runs the `gpu` tests and a
#       short bench, and writes the results to FILE (default
#       build-gpu-check/gpu-check.txt). --cpu: the same steps on a machine without a GPU,
#       running the tests that need none instead (CI runs this).
#
# On the device machine:  run(command="scripts/gpu-check.sh run --out $OUT/gpu-check.txt",
#                             carry=[".gpu-check"], timeout_s=540)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
DEBS="$REPO/.gpu-check/debs"

# What the build needs beyond a compiler, CMake and torch, with the libraries they load
# at run time. Not the C library, libstdc++, zlib or libudev: every machine has its own.
PACKAGES=(
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libpmix2 libmunge2 libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libnuma1 libltdl7
  libfabric1 libatomic1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200
  libpsm2-2 libpsm-infinipath1
  libhwloc-dev libhwloc-plugins libpciaccess0
  libtomlplusplus-dev libtomlplusplus3
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
  libgtest-dev libgmock-dev
  pkgconf pkgconf-bin libpkgconf3
  zlib1g-dev zlib1g   # checkpoints' CRC-32: the headers and the link a machine may lack
  nlohmann-json3-dev  # safetensors headers (header-only)
)
# Shared libraries a run may take from the machine itself (any Linux has them).
MACHINE_SONAMES="ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1
  libstdc++.so.6 libgcc_s.so.1 libz.so.1 libudev.so.1 libuuid.so.1"

fail() {
  echo "gpu-check: $*" >&2
  exit 1
}

fetch() {
  mkdir -p "$DEBS"
  rm -f "$DEBS"/*.deb
  # apt-get download runs as the `_apt` user where it can; a root-owned folder is fine.
  if ! (cd "$DEBS" && apt-get download "${PACKAGES[@]}" 2>/dev/null); then
    [[ "$(id -u)" -eq 0 ]] || fail "apt-get download failed; run 'sudo apt-get update' first"
    apt-get update -qq
    (cd "$DEBS" && apt-get download "${PACKAGES[@]}")
  fi
  local debs=("$DEBS"/*.deb)
  echo "gpu-check: ${#debs[@]} packages, $(du -sh "$DEBS" | cut -f1) in .gpu-check/debs"
}

# unpack PREFIX: every carried package into PREFIX, plus the links Debian's maintainer
# scripts would make (alternatives for the MPI wrappers, PSM's library directory).
unpack() {
  local prefix=$1 deb
  ls "$DEBS"/*.deb >/dev/null 2>&1 || fail "no packages in .gpu-check/debs: run 'scripts/gpu-check.sh fetch' first"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$DEBS"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  local bin="$prefix/usr/bin" lib="$prefix/usr/lib/x86_64-linux-gnu" tool
  for tool in mpirun mpiexec mpicxx mpicc mpic++; do ln -sf "$tool.openmpi" "$bin/$tool"; done
  ln -sf ../../libpsm1/libpsm_infinipath.so.1.16 "$lib/libpsm_infinipath.so.1"
}

# check_closure PREFIX: every library the build and its runs load (Open MPI and its
# launcher, PMIx, hwloc, Protobuf and protoc) finds each library it needs in PREFIX or
# among MACHINE_SONAMES; names what is missing. Plugins (MCA components, hwloc and UCX
# plugins) may lack theirs: they are skipped when they fail to load.
check_closure() {
  local prefix=$1 lib="$1/usr/lib/x86_64-linux-gnu" missing=() file needed
  local files=("$lib"/libmpi.so.40 "$lib"/libopen-pal.so.40 "$lib"/libopen-rte.so.40 "$lib"/libpmix.so.2
               "$lib"/libhwloc.so.15 "$lib"/libprotobuf.so.32 "$lib"/libprotoc.so.32 "$lib"/libfabric.so.1
               "$lib"/libucp.so.0 "$prefix"/usr/bin/orterun "$prefix"/usr/bin/orted "$prefix"/usr/bin/protoc
               "$prefix"/usr/bin/opal_wrapper "$prefix"/usr/bin/pkgconf)
  for file in "${files[@]}"; do
    [[ -e "$file" ]] || fail "the unpacked packages lack $file"
    for needed in $(readelf -d "$(readlink -f "$file")" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
      [[ " $MACHINE_SONAMES " == *" $needed "* ]] && continue
      [[ -n "$(find "$prefix" -name "$needed" -print -quit)" ]] && continue
      missing+=("$needed (for ${file#"$prefix"/})")
    done
  done
  ((${#missing[@]} == 0)) || fail "libraries missing from the carried packages: ${missing[*]}"
}

# use_prefix PREFIX: the environment that makes the unpacked tools and libraries the
# ones found (Open MPI relocated with OPAL_PREFIX; pkg-config reading only PREFIX).
use_prefix() {
  local usr="$1/usr"
  local lib="$usr/lib/x86_64-linux-gnu"
  export PATH="$usr/bin:$PATH"
  export LD_LIBRARY_PATH="$lib:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$usr" OPAL_SYSCONFDIR="$1/etc/openmpi"
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$usr/share/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$1"
  unset PKG_CONFIG_PATH
}

# check_isolation BUILD PREFIX: the configured build found Open MPI, Protobuf, hwloc,
# TOML++ and GoogleTest in PREFIX, not in the machine's /usr.
check_isolation() {
  local cache="$1/CMakeCache.txt" prefix=$2 key value wrong=()
  for key in MPI_CXX_HEADER_DIR MPI_mpi_LIBRARY Protobuf_INCLUDE_DIR Protobuf_LIBRARY_RELEASE Protobuf_PROTOC_EXECUTABLE \
             tomlplusplus_DIR GTest_DIR HWLOC_INCLUDEDIR pkgcfg_lib_HWLOC_hwloc; do
    value=$(sed -n "s/^$key:[A-Z]*=//p" "$cache")
    [[ "$value" == "$prefix"/* ]] || wrong+=("$key=${value:-<unset>}")
  done
  ((${#wrong[@]} == 0)) || fail "the build found dependencies outside $prefix: ${wrong[*]}"
}

# check_runtime BUILD PREFIX: the built programs load Open MPI, hwloc and Protobuf from
# PREFIX, and Open MPI's launcher takes its components from there.
check_runtime() {
  local build=$1 prefix=$2 program lib loaded
  for program in tests/core/comm_test:libmpi.so.40 tests/core/comm_test:libhwloc.so.15 \
                 tests/core/topology_test:libprotobuf.so.32; do
    lib=${program#*:}
    loaded=$(ldd "$build/${program%%:*}" | sed -n "s/.*$lib => \([^ ]*\).*/\1/p")
    [[ "$loaded" == "$prefix"/* ]] || fail "${program%%:*} loads $lib from '${loaded:-nowhere}', not from $prefix"
  done
  loaded=$(ompi_info --parsable --path pkglibdir | cut -d: -f3)
  [[ "$loaded" == "$prefix"/* ]] || fail "Open MPI takes its components from $loaded, not from $prefix"
}

run() {
  local cpu=0 out=""
  while (($#)); do
    case "$1" in
      --cpu) cpu=1 ;;
      --out) out=$2; shift ;;
      *) fail "unknown argument '$1' (expected --cpu, --out FILE)" ;;
    esac
    shift
  done
  local build="$REPO/build-gpu-check" prefix="$REPO/build-gpu-check/prefix" python="${PYTHON:-python3}"
  out=${out:-$build/gpu-check.txt}
  mkdir -p "$build" "$(dirname "$out")"
  : >"$out"
  report() { echo "$*" | tee -a "$out"; }
  local started=$SECONDS

  report "# scripts/gpu-check.sh run$( ((cpu)) && echo " --cpu") on $(uname -n), $(date -u +%FT%TZ)"
  unpack "$prefix"
  check_closure "$prefix"
  use_prefix "$prefix"
  local debs=("$DEBS"/*.deb)
  report "packages: ${#debs[@]} unpacked into $prefix; every library they need is there"

  local torch_dir torch_version
  torch_dir=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  torch_version=$("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')
  report "torch: $torch_version ($torch_dir)"
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
  report "nvcc: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' || echo none)"
  local gpus
  gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
  report "GPUs visible to torch: $gpus"
  ((cpu || gpus > 0)) || fail "no GPU visible; use --cpu on a machine without one"

  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  local configure_start=$SECONDS
  # /usr is ignored as a search prefix: every dependency must come from the prefix.
  cmake -S "$REPO" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_dir;$prefix/usr" -DCMAKE_IGNORE_PREFIX_PATH=/usr \
    -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpirun" \
    -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc" -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DPARALLAX_WITH_NCCL=ON >"$build/configure.log" 2>&1 || {
    tail -30 "$build/configure.log"
    fail "cmake configure failed (log: $build/configure.log)"
  }
  check_isolation "$build" "$prefix"
  report "configured in $((SECONDS - configure_start)) s; Open MPI, Protobuf, hwloc, TOML++ and GoogleTest all from the prefix"

  # The tests: every one labelled gpu, and two that prove the carried MPI and hwloc run.
  local targets=()
  mapfile -t targets < <( (cd "$build" && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p'
                           printf '%s\n' comm_test topology_test train_gpt) | sed 's/\.np[0-9]*$//;s/\.no_gpu$//' |
                           sort -u)
  local build_start=$SECONDS
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$build/build.log" 2>&1 || {
    tail -30 "$build/build.log"
    fail "build failed (log: $build/build.log)"
  }
  report "built ${#targets[@]} test programs in $((SECONDS - build_start)) s: ${targets[*]}"
  check_runtime "$build" "$prefix"
  report "they load Open MPI, hwloc and Protobuf from the prefix; mpirun takes its components from there"

  # The gpu tests (without a GPU each case skips, saying why), then the programs that
  # prove the carried MPI and hwloc run.
  local tests_log="$build/ctest.log" skipped
  (cd "$build" && ctest -L gpu --timeout 300 --verbose &&
    ctest -R '^(comm_test\.np[0-9]+|topology_test|nccl_communicator_test\.no_gpu)$' --timeout 300 \
      --output-on-failure) 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >"$tests_log" || {
    tail -40 "$tests_log"
    fail "tests failed (log: $tests_log)"
  }
  skipped=$(grep -o 'SKIPPED \] [A-Za-z][^ ]*' "$tests_log" | sort -u | wc -l)
  report "tests: $(grep -E 'tests passed' "$tests_log" | tr '\n' ';') gtest cases skipped: $skipped"
  grep -E '^ *[0-9]+/[0-9]+ Test|SKIPPED \] [A-Za-z]|\[ figures' "$tests_log" | sort -u | tee -a "$out"

  # The bench: the engine's GPT in bf16 (tokens/s, and model FLOP utilization against
  # the bf16 matrix-product rate the same torch measures in the same run), on the GPU
  # and with ZeRO-3's optimizer offloaded to the host; --cpu: a tiny model on the CPU.
  local where=() bench_start=$SECONDS
  ((cpu)) && where=(--cpu)
  "$python" "$REPO/bench/gpu_gpt.py" --train-gpt "$build/examples/train_gpt" --mpirun "$prefix/usr/bin/mpirun" \
    --config "$REPO/configs/gpt_base.toml" "${where[@]}" 2>&1 | tee -a "$out" || fail "bench/gpu_gpt.py failed"
  report "bench: done in $((SECONDS - bench_start)) s"
  report "gpu-check: done in $((SECONDS - started)) s; results in $out"
}

case "${1:-}" in
  fetch) fetch ;;
  run) shift; run "$@" ;;
  *) fail "usage: scripts/gpu-check.sh fetch | run [--cpu] [--out FILE]" ;;
esac
