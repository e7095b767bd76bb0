"""Reads a training run's TensorBoard directory with TensorBoard's own reader and checks
it against the same run's metrics JSON lines (logging.metrics_file).

    tensorboard_readback.py EVENT_DIR METRICS_JSONL

Checks: one event file, named events.out.tfevents.*, file version "brain.Event:2"; the
scalar tags core/metrics.h's tensorboard_scalars promises for this run, each with one
value per step of the metrics file, at the same steps; and the values equal the JSON
line's (loss, lr, step_ms, samples/s, tokens/s, grad norm, each rank's model-state total,
each op's bytes summed over ranks), within float32 rounding.
Exits 1 with the first mismatch named.
"""

import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier", "all_to_all")


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def expected_scalars(line):
    """The tags and values one JSON line should appear as in TensorBoard."""
    want = {
        "train/loss": line["loss"],
        "train/lr": line["lr"],
        "perf/step_ms": line["step_ms"],
        "perf/samples_per_s": line["samples_per_s"],
        # The GPT example sets tokens per sample, so its runs carry tokens/s.
        "perf/tokens_per_s": line["tokens_per_s"],
    }
    if line["grad_norm"] is None or line["grad_norm"] >= 0:
        want["train/grad_norm"] = line["grad_norm"]
    for rank, state in enumerate(line["model_state_bytes"]):
        want[f"memory/rank{rank}_bytes"] = sum(state.values())
    # Each rank's peaks in the step, where measured (-1: not).
    for rank, peak in enumerate(line.get("peak_memory", [])):
        for kind in ("allocated", "resident"):
            if peak[kind] >= 0:
                want[f"memory/rank{rank}_peak_{kind}_bytes"] = peak[kind]
    for op in OPS:
        want[f"comm/{op}_bytes"] = sum(rank[op]["bytes"] for rank in line["comm"])
    # Every op's bytes but recv's (the sender's), split by whether they reached another node.
    sent = [c for rank in line["comm"] for op, c in rank.items() if op != "recv"]
    inter = sum(c["inter_node_bytes"] for c in sent)
    want["comm/intra_node_bytes"] = sum(c["bytes"] for c in sent) - inter
    want["comm/inter_node_bytes"] = inter
    # A model with mixture-of-experts layers: its routing.
    for key, value in line.get("moe", {}).items():
        if key != "layers":
            want[f"moe/{key}"] = value
    return want


def close(got, want):
    if want is None:  # JSON's null: a loss that is not finite
        return not math.isfinite(got)
    return abs(got - want) <= 1e-6 * max(1.0, abs(want))


def main():
    event_dir, metrics_path = sys.argv[1], sys.argv[2]
    files = glob.glob(os.path.join(event_dir, "*"))
    if len(files) != 1 or not os.path.basename(files[0]).startswith("events.out.tfevents."):
        fail(f"expected one events.out.tfevents.* file in {event_dir}, found {files}")
    with open(metrics_path) as f:
        lines = [json.loads(text) for text in f if text.strip()]
    if not lines:
        fail(f"{metrics_path} is empty")

    accumulator = EventAccumulator(event_dir, size_guidance={"scalars": 0})  # 0: keep every value
    accumulator.Reload()
    if accumulator.file_version != 2.0:
        fail(f"file version {accumulator.file_version}, expected 2 (brain.Event:2)")
    tags = set(accumulator.Tags()["scalars"])
    steps = [line["step"] for line in lines]
    want_tags = set(expected_scalars(lines[0]))
    if tags != want_tags:
        fail(f"tags {sorted(tags)}, expected {sorted(want_tags)}")
    compared = 0
    for tag in sorted(tags):
        events = accumulator.Scalars(tag)
        if [e.step for e in events] != steps:
            fail(f"{tag}: steps {[e.step for e in events]}, expected one value per step {steps}")
        for event, line in zip(events, lines):
            want = expected_scalars(line)[tag]
            if not close(event.value, want):
                fail(f"{tag} at step {event.step}: TensorBoard read {event.value}, the metrics file has {want}")
            compared += 1
    print(f"{len(tags)} tags x {len(steps)} steps read back by TensorBoard's EventAccumulator; "
          f"{compared} values equal the metrics file's")


if __name__ == "__main__":
    main()
