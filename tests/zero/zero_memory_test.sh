#!/usr/bin/env bash
# Peak memory falls with the ZeRO stage: GPT (4.2M parameters) on 4 ranks at stages 0-3,
# the last step's peak of LibTorch's allocated bytes on any rank (StepMetrics::
# peak_memory, exact: the runtime's CpuMemoryMeter), each stage's below the stage
# before's. Stage 3 with zero.max_live_mb = 0, which keeps only the block in use and the
# one prefetched (the default, 1024, keeps a small model's every block through the
# forward). Two batches: 8 sequences per rank, where activations set the peak (stage 3's
# forward must release each unit as it moves on), and 1, where gradients do (stages 2-3
# must not hold every full gradient while reductions lag behind the backward).
# Mutants this catches: stage 3's forward never releasing the units used before a
# prefetched one (every unit gathered at once: stage 3 above stage 2 at batch 8);
# stages 2-3 launching every reduction without waiting for room (4 ranks sharing 2
# cores lag: stage 2 above stage 1 at batch 1).
#
#   zero_memory_test.sh MPIEXEC TRAIN_GPT CONFIG_DIR
set -euo pipefail
MPIEXEC="$1"
TRAIN="$2"
CONFIGS="$3"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/zero_memory_test.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

for batch in 32 4; do
  for stage in 0 1 2 3; do
    "$MPIEXEC" --oversubscribe --bind-to none -np 4 "$TRAIN" --config "$CONFIGS/dp.toml" \
      --set model.d_model=256 --set model.n_layer=4 --set model.vocab_size=2048 --set train.steps=3 \
      --set train.global_batch_size=$batch --set logging.every=0 --set zero.stage=$stage \
      --set zero.bucket_mb=1 --set zero.prefetch_mb=4 --set zero.max_live_mb=0 \
      --set "logging.metrics_file=\"$WORK/batch$batch.stage$stage.jsonl\"" >"$WORK/run.log" 2>&1 ||
      { cat "$WORK/run.log"; echo "FAIL: stage $stage, global batch $batch did not train"; exit 1; }
  done
done

python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
MiB = 1 << 20
failed = False
for batch, stages in ((32, (1, 2, 3)), (4, (1, 2))):
    peak = []
    for stage in range(4):
        last = json.loads(open(f"{work}/batch{batch}.stage{stage}.jsonl").read().splitlines()[-1])
        peak.append(max(rank["allocated"] for rank in last["peak_memory"]))
        state = max(rank["params"] + rank["grads"] + rank["optimizer"] for rank in last["model_state_bytes"])
        print(f"global batch {batch}, stage {stage}: peak allocated {peak[-1] / MiB:.1f} MiB, "
              f"model state {state / MiB:.1f} MiB")
    for stage in stages:
        if peak[stage] >= peak[stage - 1]:
            print(f"FAIL: at global batch {batch}, stage {stage}'s peak is not below stage {stage - 1}'s")
            failed = True
sys.exit(1 if failed else 0)
PY
