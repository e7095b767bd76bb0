# Shared by the bench scripts (sourced after scripts/common.sh).

# Benches measure with the kernels this CPU runs best (scripts/common.sh).
prefer_cpu_openblas_kernels

# bench_binary TARGET: the path of bench TARGET under $BUILD_DIR, configuring and
# building it first when $BUILD_DIR does not exist; exits with the build command when
# the directory exists without it.
bench_binary() {
  if [[ ! -d "$BUILD_DIR" ]]; then
    configure_and_build -- --target "$1" >&2
  fi
  local binary="$BUILD_DIR/bench/$1"
  if [[ ! -x "$binary" ]]; then
    echo "error: $binary not found; build it with: cmake --build $BUILD_DIR --target $1" >&2
    exit 1
  fi
  echo "$binary"
}

# bench_run NAME COMMAND...: one `mpirun -np $RANKS` of COMMAND, limited to
# $RUN_TIMEOUT_S seconds, its output in $LOGS/NAME.log; appends "NAME <its JSON line>"
# to $RESULTS, or a row saying why there is none (the build refuses the
# configuration, a timeout, an exit status).
bench_run() {
  local name="$1" log="$LOGS/$1.log"
  shift
  echo "running $name ..." >&2
  local status=0
  timeout "$RUN_TIMEOUT_S" mpirun -np "$RANKS" --oversubscribe --bind-to none "$@" >"$log" 2>&1 || status=$?
  local line
  line="$(grep -m1 '^{"impl"' "$log" || true)"
  if [[ -n "$line" ]]; then
    echo "$name $line" >>"$RESULTS"
  elif grep -q "not available" "$log"; then
    echo "$name not available (the build refuses this configuration)" >>"$RESULTS"
  elif ((status == 124)); then
    echo "$name failed: timed out after ${RUN_TIMEOUT_S}s (log: $log)" >>"$RESULTS"
  else
    echo "$name failed: exit $status (log: $log)" >>"$RESULTS"
  fi
}

# python_with_torch: the first of $PYTHON (default: /usr/bin/python3 python3) that imports
# torch.distributed.optim (the PyTorch peers' needs), or nothing.
python_with_torch() {
  local candidate
  for candidate in ${PYTHON:-/usr/bin/python3 python3}; do
    if "$candidate" -c "import torch.distributed.optim" >/dev/null 2>&1; then
      echo "$candidate"
      return
    fi
  done
}
