#!/usr/bin/env bash
# Every command the README and the pages under docs/ show runs as shown:
#  - each command of a ```sh block must exit 0;
#  - each "$ " command of another block must print every line the block shows after it
#    (on stdout or on stderr; each stream is searched whole, so interleaving cannot
#    break a line).
# Continuation lines are joined and trailing comments dropped. Commands run from the
# source directory with the build directory in place of "build", with the project's
# mpirun settings for a machine with fewer cores than ranks (--oversubscribe --bind-to
# none; as root the variables scripts/common.sh exports), and ```sh commands that train
# stop after README_STEPS (2) steps. scripts/test.sh and ctest are the suite itself,
# which .ci/run runs: they are listed, not entered again.
# Then every measured figure block is there, known and stamped
# (scripts/readme_figures.py --check).
# Usage: readme_commands_test.sh <source-dir> <build-dir>
set -u
src=$1 build=$2
steps=${README_STEPS:-2}
cd "$src" || exit 1
source scripts/common.sh
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The pages as records: "sh<TAB>command" or "shown<TAB>command<TAB>expected line ...".
extract() {
  awk '
    function flush() {
      if (cmd != "") { printf "%s\t%s", kind, cmd; for (i = 1; i <= n; i++) printf "\t%s", out[i]; print "" }
      cmd = ""; n = 0
    }
    /^```/ {
      if (!inside) { inside = 1; sh = ($0 == "```sh") } else { flush(); inside = 0 }
      next
    }
    !inside { next }
    {
      line = $0
      if (joining) { cmd = cmd " " line; joining = 0 }
      else if (sh && line ~ /[^ ]/) { flush(); kind = "sh"; cmd = line }
      else if (!sh && line ~ /^\$ /) { flush(); kind = "shown"; cmd = substr(line, 3) }
      else if (!sh && cmd != "" && line ~ /[^ ]/) { out[++n] = line; next }
      else next
      if (cmd ~ /\\$/) { sub(/\\$/, "", cmd); joining = 1 }
    }
    END { flush() }
  ' README.md docs/*.md
}

as_run_here() {
  local command=$1
  command=$(sed -E 's/[[:space:]]+#[^"'"'"']*$//' <<<"$command")  # a trailing comment
  command=${command//build\//$build/}
  command=${command//-B build/-B $build}
  command=${command//--build build/--build $build}
  command=${command//mpirun -np/mpirun --oversubscribe --bind-to none -np}
  echo "$command"
}

total=$(extract | wc -l)
failures=0 ran=0 listed=0
while IFS=$'\t' read -r -a record; do
  kind=${record[0]} shown=${record[1]}
  command=$(as_run_here "$shown")
  if [[ "$command" == *ctest* || "$command" == scripts/test.sh* ]]; then
    echo "listed  $shown   (the test suite itself: .ci/run runs it)"
    listed=$((listed + 1))
    continue
  fi
  if [[ "$kind" == sh ]]; then
    [[ "$command" == *train_gpt* || "$command" == scripts/demo.sh* ]] && command+=" --set train.steps=$steps"
    [[ "$command" == scripts/demo.sh* ]] && command="BUILD_DIR=$build $command"
  fi
  ran=$((ran + 1))
  timeout 600 bash -c "$command" </dev/null >"$logs/out" 2>"$logs/err"  # mpirun reads stdin
  rc=$?
  problem=""
  if [[ "$kind" == sh && $rc -ne 0 ]]; then
    problem="exit status $rc"
  elif [[ "$kind" == shown ]]; then
    for expected in "${record[@]:2}"; do
      if ! grep -qxF -- "$expected" "$logs/out" && ! grep -qxF -- "$expected" "$logs/err"; then
        problem="the documentation shows a line it did not print: $expected"
        break
      fi
    done
  fi
  if [[ -n "$problem" ]]; then
    failures=$((failures + 1))
    echo "FAIL    $command"
    echo "        $problem"
    tail -n 15 "$logs/out" "$logs/err" | sed 's/^/        /'
  else
    echo "ok      $command"
  fi
done < <(extract)

echo "$ran of the documentation's $total command(s) run ($listed listed), $failures failed"
figures_failed=0
python3 scripts/readme_figures.py --check || figures_failed=1
[[ $((ran + listed)) -eq $total && $ran -gt 0 && $failures -eq 0 && $figures_failed -eq 0 ]]
