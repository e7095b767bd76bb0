#!/usr/bin/env bash
# Exported weights work outside Parallax, and weights files start runs under any layout:
#  1. the GPT example (configs/gpt_base.toml) trains 6 steps on 2 ranks under ZeRO-1,
#     saving at step 5, and at the end exports step 6 (checkpoint.export_on_finish),
#     byte for byte what parallax_checkpoint exports;
#  2. parallax_checkpoint exports step 5 to torch.save's format and to safetensors;
#  3. a plain LibTorch program (plain_gpt_loss: torch::pickle_load, no Parallax runtime)
#     loads the .pt file and computes the loss of step 6's global batch, which must be
#     the training run's own step-6 loss within TOLERANCE (relative: the dp ranks sum in
#     another order; measured 3.2e-8);
#  3b. the same for a checkpoint saved under tp 2, whose split parameters the export joins;
#  4. with PYTHON (a PyTorch 2.11 interpreter), torch.load and the safetensors library
#     read the same names and values (their checksum equals the C++ reader's); PyTorch
#     writes them back: torch.save of the dict converts to exactly our safetensors export,
#     torch.save of an OrderedDict (Module.state_dict()) is refused with advice (LibTorch's
#     unpickler reads OrderedDict as None), and safetensors.torch.save_file writes the file
#     step 5 starts from;
#  5. a pipeline run (pp 2) starts from that safetensors file (without PYTHON: from the
#     exported .pt converted): its first loss must be the plain program's loss on batch 0
#     with the same weights.
# Mutants this catches: an export that pairs names with the wrong tensors, or writes a
# rank's shard instead of the whole tensor (step 3 fails), or joins tp parts ignoring
# their cut (3b); an import that leaves a stage's weights at their initial values (step
# 5 fails).
#
#   export_test.sh MPIEXEC TRAIN_GPT PARALLAX_CHECKPOINT PLAIN_GPT_LOSS CONFIG_DIR [PYTHON]
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
TOOL="$3"
PLAIN="$4"
CONFIGS="$5"
PYTHON="${6:-}"
TOLERANCE=3e-7
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/export_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

fail() {
  echo "FAIL: $*"
  exit 1
}

# run NAME RANKS ARGS...: train_gpt, its metrics in $WORK/NAME.jsonl.
run() {
  local name="$1" ranks="$2"
  shift 2
  timeout 300 "$MPIEXEC" --oversubscribe --bind-to none -np "$ranks" "$TRAIN" --config "$CONFIGS/${CONFIG:-gpt_base.toml}" \
    --set logging.every=0 --set "logging.metrics_file=\"$WORK/$name.jsonl\"" "$@" >"$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "$name"; }
}

# loss_at NAME STEP: the loss the run logged for STEP (1-based).
loss_at() {
  grep "\"step\":$2," "$WORK/$1.jsonl" | sed 's/.*"loss":\([^,}]*\).*/\1/'
}

# close_to WHAT GOT WANT: relative difference within TOLERANCE, printed as a figure.
close_to() {
  awk -v what="$1" -v got="$2" -v want="$3" -v tolerance="$TOLERANCE" 'BEGIN {
    d = got - want; if (d < 0) d = -d; d /= (want < 0 ? -want : want)
    printf "[ figures  ] %-44s %.9g vs %.9g, relative difference %.1e\n", what, got, want, d
    exit d > tolerance }' || fail "$1: beyond $TOLERANCE"
}

run zero1-dp2 2 --set zero.stage=1 --set train.steps=6 --set "checkpoint.dir=\"$WORK/ckpt\"" --set checkpoint.every=5 \
  --set "checkpoint.export_on_finish=\"$WORK/final.safetensors\""
STEP5="$WORK/ckpt/step-000000000005"
# export_on_finish: engine.finish() wrote the final (step 6) weights, as the tool does.
"$TOOL" export "$WORK/ckpt/step-000000000006" "$WORK/step6.safetensors" >/dev/null
cmp -s "$WORK/final.safetensors" "$WORK/step6.safetensors" || fail "export_on_finish differs from the tool's export of step 6"
"$TOOL" export "$STEP5" "$WORK/gpt.pt" | tee "$WORK/export.log"
"$TOOL" export "$STEP5" "$WORK/gpt.safetensors" >/dev/null
grep -q "wrote 29 tensors" "$WORK/export.log" || fail "expected the model's 29 parameters"

read -r _ plain_loss _ plain_checksum < <("$PLAIN" "$WORK/gpt.pt" 160 32)
close_to "plain LibTorch loss, step 6's batch" "$plain_loss" "$(loss_at zero1-dp2 6)"

# A checkpoint saved under tp 2 (configs/tp.toml: fused [q | k | v], row and vocabulary
# cuts) exports whole: the parts are joined, and the plain program's loss matches again.
CONFIG=tp.toml run tp2 2 --set train.steps=6 --set "checkpoint.dir=\"$WORK/tp2\"" --set checkpoint.every=5
"$TOOL" export "$WORK/tp2/step-000000000005" "$WORK/tp2.pt" >"$WORK/export-tp2.log"
grep -q "wrote 29 tensors" "$WORK/export-tp2.log" || fail "tp 2: expected the model's 29 parameters, whole"
read -r _ tp2_loss _ < <("$PLAIN" "$WORK/tp2.pt" 160 32)
# tp 2's split products sum in another order: measured 6.4e-8 (Debian), 1.3e-7 (wheel);
# a join that ignores the fused [q | k | v] blocks misses by 5e-3.
TOLERANCE=1.5e-6 close_to "plain LibTorch loss, tp 2's step 6 batch" "$tp2_loss" "$(loss_at tp2 6)"

# The weights back from PyTorch: a torch.save'd dict converts to exactly our own
# safetensors export; a Module.state_dict() (an OrderedDict) is refused with advice;
# the safetensors file Python wrote is what the pipeline run starts from.
imported="$WORK/imported.safetensors"
if [[ -n "$PYTHON" ]]; then
  "$PYTHON" "$HERE/read_exported.py" "$WORK/gpt.pt" "$WORK/gpt.safetensors" "$WORK/python" | tee "$WORK/python.log"
  python_checksum="$(sed -n 's/.*python checksum //p' "$WORK/python.log")"
  TOLERANCE=1e-12 close_to "checksum: torch.load vs torch::pickle_load" "$python_checksum" "$plain_checksum"
  "$TOOL" convert "$WORK/python.pt" "$imported" >/dev/null
  cmp -s "$imported" "$WORK/gpt.safetensors" || fail "PyTorch's torch.save of the dict converts to other bytes"
  if "$TOOL" convert "$WORK/python.state_dict.pt" "$WORK/refused.safetensors" 2>"$WORK/refused.log"; then
    fail "an OrderedDict state dict converted (LibTorch reads it as None)"
  fi
  grep -q "safetensors.torch.save_file" "$WORK/refused.log" || fail "no advice for a state dict: $(cat "$WORK/refused.log")"
  imported="$WORK/python.safetensors"
else
  echo "no PyTorch here (Debian's LibTorch): the Python readers run in the wheel build's pass"
  "$TOOL" convert "$WORK/gpt.pt" "$imported"
fi
read -r _ batch0_loss _ < <("$PLAIN" "$WORK/gpt.pt" 0 32)
run import-pp2 2 --set parallel.pp=2 --set train.steps=1 --set "checkpoint.load=\"$imported\""
grep -q "started from the weights in" "$WORK/import-pp2.log" || fail "the pp 2 run did not report the import"
close_to "pp 2 started from the weights, batch 0" "$(loss_at import-pp2 1)" "$batch0_loss"
