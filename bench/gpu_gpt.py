"""The engine's GPT throughput on one GPU in bf16: tokens/s and model FLOP utilization
against the bf16 matrix-product rate measured in the same run, with the whole state on
the GPU (ZeRO stage 0) and with ZeRO-3 and its optimizer offloaded to the host (the fused
CPU Adam, gradients and updated shards over the side stream). scripts/gpu-check.sh runs
it; --cpu runs the same rows with a tiny model on the CPU, so the bench cannot rot.

  python3 bench/gpu_gpt.py --train-gpt build/examples/train_gpt --mpirun mpirun
  python3 bench/gpu_gpt.py --train-gpt build/examples/train_gpt --mpirun mpirun --cpu

Model FLOPs per token: 6 x (the parameters of the blocks and the head) + 12 x n_layer x
d_model x block_size for attention's two products (Megatron's formula, no recomputation).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import matmul_rate  # noqa: E402

GPU_MODEL = dict(vocab_size=32768, block_size=1024, d_model=1024, n_layer=12, n_head=16)
CPU_MODEL = dict(vocab_size=256, block_size=64, d_model=64, n_layer=2, n_head=4)
ROWS = (("stage 0, all state on the device", []),
        ("ZeRO-3, optimizer on the host", ["zero.stage=3", 'zero.wrap=["Block"]', 'offload.optimizer="cpu"']))


def flops_per_token(model):
    d, layers, vocab, seq = model["d_model"], model["n_layer"], model["vocab_size"], model["block_size"]
    block = 3 * d * d + 3 * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d + 4 * d
    return 6 * (layers * block + vocab * d) + 12 * layers * d * seq


def run_row(args, model, extra, metrics):
    batch, steps = (8, args.steps) if not args.cpu else (4, 6)
    sets = [f"model.{key}={value}" for key, value in model.items()]
    sets += [f"train.global_batch_size={batch}", f"train.steps={steps}", "train.grad_accum=1",
             'precision.dtype="bf16"', f'train.device="{"cpu" if args.cpu else "cuda"}"',
             "logging.every=0", f'logging.metrics_file="{metrics}"'] + extra
    command = [args.mpirun, "-np", "1", args.train_gpt, "--config", args.config]
    for item in sets:
        command += ["--set", item]
    if os.geteuid() == 0:
        command[1:1] = ["--allow-run-as-root"]
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        sys.exit(f"gpu_gpt: {' '.join(command)} failed ({finished.returncode}):\n{finished.stdout[-2000:]}"
                 f"{finished.stderr[-2000:]}")
    with open(metrics) as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    measured = [r["tokens_per_s"] for r in records[len(records) // 3:] if r.get("tokens_per_s")]
    if not measured:
        sys.exit(f"gpu_gpt: no tokens_per_s in {metrics}")
    return sum(measured) / len(measured), len(measured), time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-gpt", required=True, help="the built examples/gpt/train_gpt")
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "gpt_base.toml"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cpu", action="store_true", help="a tiny model on the CPU (no GPU needed)")
    args = parser.parse_args()
    import torch
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    size = 256 if args.cpu else 8192
    peak = matmul_rate.rate(size, torch.bfloat16, device, 2 if args.cpu else 3, 5 if args.cpu else 10)
    model = CPU_MODEL if args.cpu else GPU_MODEL
    per_token = flops_per_token(model)
    where = "the CPU" if args.cpu else torch.cuda.get_device_name(device)
    print(f"GPT {model} in bf16 on {where}, 1 rank; bf16 matmul {size}^3 in this run: {peak:.3g} TFLOP/s; "
          f"{per_token / 1e9:.3g} GFLOP per token")
    print(f"{'row':<32} {'tokens/s':>12} {'MFU':>8} {'steps':>6} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as scratch:
        for name, extra in ROWS:
            tokens, counted, wall = run_row(args, model, extra, os.path.join(scratch, "metrics.jsonl"))
            mfu = tokens * per_token / (peak * 1e12)
            print(f"{name:<32} {tokens:>12.0f} {mfu:>8.3f} {counted:>6} {wall:>7.1f}")


if __name__ == "__main__":
    main()
