#!/usr/bin/env python3
"""The PyTorch peer of bench/pipeline.sh's schedule table: the same GPT, data, batch and
initial weights as train_gpt's pipeline, run by torch.distributed.pipelining (PyTorch 2.x)
over parallel.pp ranks on gloo, one rank per stage (pp = world size, no data
parallelism). The model is cut as Parallax cuts it with pipeline.partition = "uniform":
embeddings, each block and the head are the layers, split into pp × virtual_stages
contiguous parts, part c·pp + r on rank r.

  pipeline.schedule   PyTorch schedule
  gpipe               ScheduleGPipe
  1f1b                Schedule1F1B
  interleaved         ScheduleInterleaved1F1B (virtual_stages chunks per rank)
  zb-h1               ScheduleInterleavedZeroBubble with one chunk per rank (its ZB1P
                      schedule: weight gradients deferred into the cool-down's bubble)

A step: the schedule over train.grad_accum micro-batches (the mean of their losses, as
Parallax's), the global-norm clipping over all stages, AdamW at the scheduled learning
rate. Prints one JSON line: {"impl": "torch-pipelining", "schedule": ..., "median_step_ms":
..., "losses": [...]}, the median over steps after 2 warm-up of the slowest rank's step.

  mpirun -np 2 python3 bench/peers/torch_pp.py --config configs/pp.toml \\
      --initial-weights /tmp/w.pt --set pipeline.schedule=\\"1f1b\\"
"""
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble)

from torch_zero import (GPT, count_collectives, gather, load_config, load_initial_weights, model_and_data,
                        peer_arguments, report_and_exit, resolve_batch, scheduled_lr, this_rank)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zb-h1": ScheduleInterleavedZeroBubble}
MULTI_STAGE = ("interleaved", "zb-h1")  # schedules that take a list of this rank's stages


class Embeddings(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.token_embedding, self.position_embedding = gpt.token_embedding, gpt.position_embedding

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), dtype=torch.long)
        return self.token_embedding(tokens) + self.position_embedding(positions).unsqueeze(0)


class Head(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x):
        return self.head(self.ln_f(x))


def uniform_boundaries(layers, parts):
    """pipeline::uniform_boundaries: the first `layers % parts` parts take one layer more."""
    base, larger = divmod(layers, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < larger else 0))
    return bounds


def main():
    args = peer_arguments(__doc__.splitlines()[0], weights_required=True).parse_args()
    rank, world, rendezvous = this_rank("torch_pp")

    config = load_config(args.config, args.overrides)
    train, parallel, pipe = config.get("train", {}), config.get("parallel", {}), config.get("pipeline", {})
    if parallel.get("pp", 1) != world or parallel.get("tp", 1) != 1:
        raise SystemExit(f"torch_pp.py runs one stage per rank: parallel.pp = {world} (the world size), tp = 1")
    kind, chunks = pipe.get("schedule", "1f1b"), pipe.get("virtual_stages", 1)
    if kind not in SCHEDULES or (kind == "interleaved") != (chunks > 1):
        raise SystemExit(f"pipeline.schedule = {kind} with virtual_stages = {chunks}: this peer runs "
                         f"{', '.join(SCHEDULES)} (interleaved with virtual_stages > 1, the others with 1)")
    glob, micro_batch, accum = resolve_batch(train, 1)
    steps, seed = train.get("steps", 100), train.get("seed", 1234)
    m, data = model_and_data(config, seed)
    opt_cfg, sched_cfg = config.get("optimizer", {}), config.get("scheduler", {})

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    gpt = GPT(m)
    load_initial_weights(gpt, args.initial_weights)
    layers = [Embeddings(gpt), *gpt.blocks, Head(gpt)]
    parts = world * chunks
    bounds = uniform_boundaries(len(layers), parts)
    indices = [c * world + rank for c in range(chunks)]
    modules = [nn.Sequential(*layers[bounds[i]:bounds[i + 1]]) for i in indices]
    stages = [PipelineStage(module, i, parts, torch.device("cpu")) for module, i in zip(modules, indices)]

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, m["vocab_size"]).float(), targets.reshape(-1))

    schedule = SCHEDULES[kind](stages if kind in MULTI_STAGE else stages[0], accum, loss_fn=loss_fn)
    first, last = 0 in indices, parts - 1 in indices
    params = [p for module in modules for p in module.parameters()]
    optimizer = torch.optim.AdamW(params, lr=opt_cfg.get("lr", 3e-4), betas=tuple(opt_cfg.get("betas", (0.9, 0.999))),
                                  eps=opt_cfg.get("eps", 1e-8), weight_decay=opt_cfg.get("weight_decay", 0.0))
    grad_clip = opt_cfg.get("grad_clip", 0.0)

    def train_step(step, inputs, targets, micro_losses):
        schedule.step(*([inputs] if first else []), **({"target": targets, "losses": micro_losses} if last else {}))
        if grad_clip > 0:
            squares = sum((p.grad.double().pow(2).sum() for p in params if p.grad is not None),
                          torch.zeros((), dtype=torch.float64))
            dist.all_reduce(squares)
            norm = math.sqrt(squares.item())
            if norm + 1e-6 > grad_clip:
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(grad_clip / (norm + 1e-6))
        for group in optimizer.param_groups:
            group["lr"] = scheduled_lr(opt_cfg, sched_cfg, steps, step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    step_ms, losses = [], []
    for step in range(steps):
        inputs, targets = data.batch(step * glob, glob)  # micro-batch i: samples i·micro .. (i+1)·micro
        micro_losses = []
        start = time.perf_counter()
        train_step(step, inputs, targets, micro_losses)
        step_ms.append((time.perf_counter() - start) * 1000.0)
        loss = torch.tensor(float(torch.stack(micro_losses).detach().mean()) if last else 0.0, dtype=torch.float64)
        dist.all_reduce(loss)
        losses.append(loss.item())

    # One more step, profiled, for the bytes a step communicates (sends, receives and the
    # norm's all-reduce, counted as Parallax's engine counts them; after the figures above).
    inputs, targets = data.batch((steps - 1) * glob, glob)
    comm = count_collectives(lambda: train_step(steps - 1, inputs, targets, []), world)
    all_comm = gather(list(comm), torch.float64).tolist()
    report_and_exit(rank, {"impl": "torch-pipelining", "schedule": kind, "ranks": world,
                           "comm_bytes_per_step": [round(c[0]) for c in all_comm],
                           "comm_calls_per_step": [c[1] for c in all_comm]}, step_ms, losses, rendezvous)

if __name__ == "__main__":
    main()
