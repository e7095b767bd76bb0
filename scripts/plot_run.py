#!/usr/bin/python3
"""A one-page PNG summary of a finished run, from its metrics file (logging.metrics_file).

    scripts/plot_run.py METRICS_JSONL OUT.png

Three panels: the loss per step; the step time per step (ms; the first step holds the
warm-up); and each rank's model state at the last step (bytes, stacked by kind: params,
grads, optimizer, host, nvme; the sum is what TensorBoard's memory/rank<r>_bytes shows).
Runs with Debian's Python and its python3-matplotlib (scripts/common.sh installs it).
"""

import json
import math
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

KINDS = ("params", "grads", "optimizer", "host", "nvme")


def read_lines(path):
    with open(path) as f:
        lines = [json.loads(text) for text in f if text.strip()]
    if not lines:
        sys.exit(f"plot_run.py: {path} holds no metrics lines")
    return lines


def human_bytes(value, _position=None):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: scripts/plot_run.py METRICS_JSONL OUT.png")
    metrics_path, out_path = sys.argv[1], sys.argv[2]
    lines = read_lines(metrics_path)
    steps = [line["step"] for line in lines]
    # A diverged loss is null in the file: a gap in the curve.
    loss = [math.nan if line["loss"] is None else line["loss"] for line in lines]
    step_ms = [math.nan if line["step_ms"] is None else line["step_ms"] for line in lines]
    last = lines[-1]
    states = last["model_state_bytes"]

    figure, (loss_axes, time_axes, memory_axes) = plt.subplots(1, 3, figsize=(15, 4.2))
    figure.suptitle(f"{metrics_path}: {len(steps)} steps, {len(states)} rank(s)")

    loss_axes.plot(steps, loss, color="tab:blue")
    loss_axes.set(title="loss (global batch mean)", xlabel="step", ylabel="loss")
    loss_axes.grid(alpha=0.3)

    time_axes.plot(steps, step_ms, color="tab:orange")
    time_axes.set(title="step time (first step: warm-up)", xlabel="step", ylabel="ms")
    time_axes.set_ylim(bottom=0)
    time_axes.grid(alpha=0.3)

    ranks = list(range(len(states)))
    bottom = [0] * len(states)
    for kind in KINDS:
        values = [state[kind] for state in states]
        if any(values):
            memory_axes.bar(ranks, values, bottom=bottom, label=kind)
            bottom = [b + v for b, v in zip(bottom, values)]
    memory_axes.set(title=f"model state per rank (step {last['step']})", xlabel="rank", ylabel="bytes")
    memory_axes.set_ylim(0, max(max(bottom), 1) * 1.3)  # headroom for the legend
    memory_axes.set_xticks(ranks)
    memory_axes.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(human_bytes))
    memory_axes.legend(fontsize="small")
    memory_axes.grid(alpha=0.3, axis="y")

    figure.tight_layout()
    figure.savefig(out_path, dpi=100)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
