# shellcheck shell=bash
# Shared by scripts/demo.sh and scripts/test.sh (sourced, not run). Provides:
#   ensure_dependencies       installs missing Debian packages (root), or prints the
#                             apt-get line and exits 1 (not root)
#   configure_and_build ARGS  configures Release into ${BUILD_DIR:-build} with the cmake
#                             ARGS before "--", then builds with the ARGS after it
#   prefer_cpu_openblas_kernels  exports OPENBLAS_CORETYPE for this CPU's best kernels
# and exports the environment Open MPI needs to run here (as root, in containers).

PARALLAX_DEB_PACKAGES=(
  cmake make g++ pkg-config ccache
  libtorch-dev libopenblas0-pthread   # without the pthread OpenBLAS, LibTorch uses reference BLAS
  libopenmpi-dev openmpi-bin
  libtomlplusplus-dev libprotobuf-dev protobuf-compiler libhwloc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)

ensure_dependencies() {
  if ! command -v dpkg-query >/dev/null; then
    echo "note: dpkg-query not found (not Debian); assuming the dependencies are installed" >&2
    return 0
  fi
  local missing=() pkg
  for pkg in "${PARALLAX_DEB_PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)" != installed ]]; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} == 0)); then return 0; fi
  local install="DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "Missing Debian packages: ${missing[*]}" >&2
    echo "Install them with:" >&2
    echo "  sudo apt-get update && sudo $install" >&2
    exit 1
  fi
  echo "Installing missing Debian packages: ${missing[*]}"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# configure_and_build [cmake configure args...] [-- cmake --build args...]
configure_and_build() {
  local configure=() build=()
  while (($#)) && [[ "$1" != "--" ]]; do configure+=("$1"); shift; done
  (($#)) && shift
  build=("$@")
  local dir="${BUILD_DIR:-build}"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "${configure[@]}"
  cmake --build "$dir" -j "$(nproc)" "${build[@]}"
}

# prefer_cpu_openblas_kernels: exports OPENBLAS_CORETYPE (unless set) for the best
# kernels this CPU runs. Debian's OpenBLAS 0.3.21 falls back to its SSE3 ("Prescott")
# kernels on CPUs it does not recognize (many VMs hide the model), ~3x slower than the
# AVX-512 or AVX2 kernels the CPU runs, and it reads the variable only when it loads.
# The demo and the benches call it; the tests keep the kernels OpenBLAS picks (their
# parameter bounds were measured with them). The runtime warns when a run lost them.
prefer_cpu_openblas_kernels() {
  [[ -z "${OPENBLAS_CORETYPE:-}" && -r /proc/cpuinfo ]] || return 0
  local flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo) "
  if [[ "$flags" == *" avx512f "* && "$flags" == *" avx512vl "* && "$flags" == *" avx512bw "* &&
        "$flags" == *" avx512dq "* ]]; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif [[ "$flags" == *" avx2 "* && "$flags" == *" fma "* ]]; then
    export OPENBLAS_CORETYPE=Haswell
  fi
}

# Open MPI refuses to run as root without these, and its CMA single-copy transport
# fails inside containers (ptrace is not permitted), so shared memory copies twice.
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
if [[ "$(id -u)" -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
