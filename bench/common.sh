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

# train_gpt_binary: the GPT example under $BUILD_DIR, configuring and building it first
# when $BUILD_DIR does not exist; exits with the build command when the directory exists
# without it.
train_gpt_binary() {
  local train="$BUILD_DIR/examples/train_gpt"
  if [[ ! -x "$train" ]]; then
    [[ -d "$BUILD_DIR" ]] && { echo "error: $train not found; build it with: cmake --build $BUILD_DIR --target train_gpt" >&2; exit 1; }
    configure_and_build -- --target train_gpt >&2
  fi
  echo "$train"
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

# bench_measure NAME COMMAND...: bench_run's timed run of COMMAND (its line in $RESULTS,
# `--set train.steps=$STEPS` appended), then a 3-step memory run of it (its line in
# $MEMORY) with MALLOC_MMAP_THRESHOLD_=65536, so that glibc returns large frees to the
# system and the peak RSS the command reports shows what was live at once rather than
# what the allocator kept (a threshold that would slow the timed run by page faults).
bench_measure() {
  local name="$1"
  shift
  bench_run "$name" "$@" --set "train.steps=$STEPS"
  RESULTS="$MEMORY" MALLOC_MMAP_THRESHOLD_=65536 bench_run "$name" "$@" --set train.steps=3
}

# bench_peak_rss NAME COMMAND...: bench_measure's memory run for a command that does not
# report its own peak RSS: each rank runs under a wrapper that records its child's
# ru_maxrss; appends "NAME {"peak_rss_mib": [one per rank]}" to $MEMORY. COMMAND takes
# its step count from its own arguments.
bench_peak_rss() {
  local name="$1" log="$LOGS/$1.memory.log" per_rank
  shift
  per_rank="$(mktemp "$LOGS/$name.rss.XXXXXX")"
  echo "running $name (memory) ..." >&2
  if MALLOC_MMAP_THRESHOLD_=65536 timeout "$RUN_TIMEOUT_S" mpirun -np "$RANKS" --oversubscribe --bind-to none \
    "$PARALLAX_TORCH_VENV/bin/python" -c '
import resource, subprocess, sys
status = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "a") as out:
    out.write(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0:.1f}\n")
sys.exit(status)' "$per_rank" "$@" >"$log" 2>&1; then
    echo "$name {\"peak_rss_mib\": [$(paste -sd, "$per_rank" | sed 's/,/, /g')]}" >>"$MEMORY"
  else
    echo "$name failed (log: $log)" >>"$MEMORY"
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

# Awk functions the bench tables share, for JSON lines of the benches and their peers:
#   field(line, key)        a scalar field's text ("" when absent; "key": value or "key":value)
#   list(line, key, v)      a list field's items into v[1..n]; returns n (0 when absent)
#   list_max(line, key)     a list field's largest item ("" when absent)
#   loss_gap(line)          the largest relative difference of the line's "losses" from the
#                           reference set by set_reference_losses(line), "n/a" when either
#                           lacks them or their lengths differ, "non-finite" for a NaN step
#   median(v, n)            the median of v[1..n] (sorts v)
BENCH_AWK_FUNCTIONS='
  function field(line, key,    m) {
    if (!match(line, "\"" key "\": *[^,}]+")) return ""
    m = substr(line, RSTART, RLENGTH); sub(/^[^:]*: */, "", m); gsub(/"/, "", m); return m
  }
  function list(line, key, v,    m) {
    if (!match(line, "\"" key "\": *\\[[^]]*\\]")) return 0
    m = substr(line, RSTART, RLENGTH); sub(/^[^[]*\[/, "", m); sub(/\]$/, "", m)
    return split(m, v, /, */)
  }
  function list_max(line, key,    v, n, i, best) {
    n = list(line, key, v)
    if (n == 0) return ""
    best = v[1] + 0
    for (i = 2; i <= n; ++i) if (v[i] + 0 > best) best = v[i] + 0
    return best
  }
  function median(v, n,    i, j, x) {
    for (i = 2; i <= n; ++i) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; --j) v[j + 1] = v[j]; v[j + 1] = x }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  function set_reference_losses(line) { reference_n = list(line, "losses", reference_loss) }
  function loss_gap(line,    v, n, i, d, worst) {
    n = list(line, "losses", v)
    if (n == 0 || n != reference_n) return "n/a"
    worst = 0
    for (i = 1; i <= n; ++i) {
      if (v[i] + 0 < 0 || reference_loss[i] < 0) return "non-finite"
      d = v[i] - reference_loss[i]; if (d < 0) d = -d
      d /= (reference_loss[i] > 0 ? reference_loss[i] : 1)
      if (d > worst) worst = d
    }
    return sprintf("%.1e", worst)
  }
'
