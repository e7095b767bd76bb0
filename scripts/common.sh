# shellcheck shell=bash
# Shared by scripts/demo.sh and scripts/test.sh (sourced, not run). Provides:
#   ensure_dependencies       installs missing Debian packages (root), or prints the
#                             apt-get line and exits 1 (not root); then, with
#                             TORCH=wheel, the LibTorch wheel's virtual environment
#   configure_and_build ARGS  configures Release into $BUILD_DIR against the LibTorch
#                             TORCH selects, with the cmake ARGS before "--", then builds
#                             with the ARGS after it; a new build directory gets Clang
#                             (unless CXX names another compiler): with its precompiled
#                             LibTorch header a file builds 3-4x faster than with GCC
#   prefer_cpu_openblas_kernels  exports OPENBLAS_CORETYPE for this CPU's best kernels
# and exports the environment Open MPI needs to run here (as root, in containers).

PARALLAX_DEB_PACKAGES=(
  cmake make g++ pkg-config ccache
  libtorch-dev libopenblas0-pthread   # without the pthread OpenBLAS, LibTorch uses reference BLAS
  libtcmalloc-minimal4   # bench/plan_accuracy.sh's malloc: glibc's keeps freed buffers resident
  iproute2               # tests/cluster/two_nodes.sh: the veth link between the two hosts
  slurmctld slurmd slurm-client munge   # tests/cluster/slurm.sh: a real Slurm controller and node
  libpmix-dev            # Slurm's PMIx plugin (srun --mpi=pmix) loads libpmix.so without depending on it
  libopenmpi-dev openmpi-bin
  libtomlplusplus-dev libprotobuf-dev protobuf-compiler libhwloc-dev zlib1g-dev nlohmann-json3-dev
  libboost-dev        # header-only Boost.CRC: the CRC-32C of TensorBoard's records (core/tensorboard_writer.cpp)
  python3-matplotlib  # scripts/plot_run.py (run by Debian's /usr/bin/python3)
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev   # the compiler the scripts build with; scripts/fuzz.sh's libFuzzer
)

# TORCH selects the LibTorch every script builds against (both are tested in CI):
#   TORCH=debian (default)  Debian's libtorch-dev 1.13, CPU only; BUILD_DIR defaults to build
#   TORCH=wheel             LibTorch 2.11 from the PyPI wheel torch==2.11.0 (a CUDA 13.0 build;
#                           its CPU code runs without a GPU), installed into the virtual
#                           environment .venv/torch-2.11.0 (about 5 GB; kept between runs,
#                           pip's cache keeps the download); BUILD_DIR defaults to build-wheel.
#                           Configuring needs the CUDA toolkit (nvcc on the PATH, or in
#                           /usr/local/cuda/bin).
# Any other LibTorch: leave TORCH unset and pass -DCMAKE_PREFIX_PATH=<its cmake dir> to cmake.
PARALLAX_TORCH_WHEEL=torch==2.11.0
PARALLAX_TORCH_VENV=.venv/torch-2.11.0
case "${TORCH:=debian}" in
  debian)
    BUILD_DIR="${BUILD_DIR:-build}"
    PARALLAX_DEB_PACKAGES+=(python3-venv)   # the tests' .venv/test-tools
    ;;
  wheel)
    BUILD_DIR="${BUILD_DIR:-build-wheel}"
    PARALLAX_DEB_PACKAGES+=(python3-venv python3-pip)
    if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
      export PATH="/usr/local/cuda/bin:$PATH"
    fi
    ;;
  *)
    echo "TORCH=$TORCH: expected debian (Debian's LibTorch 1.13) or wheel (LibTorch 2.11 from PyPI)" >&2
    exit 2
    ;;
esac
export TORCH BUILD_DIR

# The wheel's virtual environment, created once; .complete marks a finished install.
ensure_torch_wheel() {
  local venv="$PARALLAX_TORCH_VENV"
  if [[ -f "$venv/.complete" ]]; then
    # Added since the environment was made: safetensors (checkpoint_export_test reads with
    # it), tensorboard (tensorboard_readback_test reads with its EventAccumulator).
    "$venv/bin/python" -c 'import safetensors' 2>/dev/null || "$venv/bin/pip" install --quiet safetensors
    "$venv/bin/python" -c 'import tensorboard' 2>/dev/null || "$venv/bin/pip" install --quiet tensorboard
    return 0
  fi
  echo "Installing $PARALLAX_TORCH_WHEEL into $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet "$PARALLAX_TORCH_WHEEL" numpy safetensors tensorboard
  touch "$venv/.complete"
}

# The cmake arguments that select TORCH's LibTorch.
torch_cmake_args() {
  if [[ "$TORCH" == wheel ]]; then
    echo "-DCMAKE_PREFIX_PATH=$("$PARALLAX_TORCH_VENV/bin/python" -c \
      'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
  fi
}

# The Python the tests read a run's output with (TensorBoard's own reader): the wheel's
# environment, which has tensorboard; for TORCH=debian a small environment of its own,
# .venv/test-tools (Debian 12 packages no tensorboard), created once, unless only some
# labels run (PARALLAX_TEST_LABELS; CI's "versioned" pass has no test that reads).
PARALLAX_TEST_TOOLS_VENV=.venv/test-tools
ensure_test_python() {
  PARALLAX_TEST_PYTHON=""
  if [[ "$TORCH" == wheel ]]; then
    PARALLAX_TEST_PYTHON="$PWD/$PARALLAX_TORCH_VENV/bin/python"
  elif [[ -z "${PARALLAX_TEST_LABELS:-}" ]]; then
    local venv="$PARALLAX_TEST_TOOLS_VENV"
    if ! "$venv/bin/python" -c 'import tensorboard' 2>/dev/null; then
      echo "Installing tensorboard into $venv (the tests read TensorBoard's files with it)"
      rm -rf "$venv"
      if ! { /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install --quiet tensorboard; }; then
        echo "warning: could not install tensorboard into $venv; tensorboard_readback_test will skip" >&2
        rm -rf "$venv"
        PARALLAX_TEST_PYTHON=""
        export PARALLAX_TEST_PYTHON
        return 0
      fi
    fi
    PARALLAX_TEST_PYTHON="$PWD/$venv/bin/python"
  fi
  export PARALLAX_TEST_PYTHON
}

ensure_dependencies() {
  ensure_debian_packages
  if [[ "$TORCH" == wheel ]]; then ensure_torch_wheel; fi
}

ensure_debian_packages() {
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
  local dir="$BUILD_DIR" torch_args compiler=()
  torch_args=$(torch_cmake_args)
  # The compiler is chosen when the directory is first configured, and kept after.
  if [[ ! -f "$dir/CMakeCache.txt" && -z "${CXX:-}" ]] && command -v clang++ >/dev/null; then
    compiler=(-DCMAKE_CXX_COMPILER=clang++)
  fi
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release ${torch_args:+"$torch_args"} "${compiler[@]}" "${configure[@]}"
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
