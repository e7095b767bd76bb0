#!/usr/bin/env python3
"""The PyTorch peer of bench/tp.sh: the same GPT, data, batch and initial weights as
bench_zero_step, split by DTensor tensor parallelism (torch.distributed.tensor.parallel,
PyTorch 2.x) the way configs/tp.toml splits it for Parallax, over a CPU (dp, tp) device
mesh on gloo:

  token_embedding   RowwiseParallel (vocabulary rows split, output summed)  = vocab_embedding
  blocks.*.qkv      ColwiseParallel, rows regrouped so each rank holds its heads' q, k and v
                                                                           = column, parts 3
  blocks.*.attn_proj, blocks.*.mlp_proj  RowwiseParallel                   = row
  blocks.*.fc       ColwiseParallel                                        = column
  head              ColwiseParallel, logits left split, loss_parallel()    = vocab_output
  the rest          replicated

Data parallelism over the mesh's dp dimension all-reduces every gradient's local part in
one flat buffer after the window's last backward (no overlap with backward); the global
norm counts each element once; AdamW as configured. Sequence parallelism is not run.

It prints bench_zero_step's JSON line with "impl" "torch-dtensor": step times, losses,
ru_maxrss per rank, and the bytes and calls of every collective one more (profiled) step
makes per rank (count_collectives; no per-group split: DTensor does not report one).

  mpirun -np 4 python3 bench/peers/torch_tp.py --config configs/tp.toml \\
      --initial-weights /tmp/w.pt --set parallel.tp=2
"""
import math
import resource
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                               parallelize_module)

from torch_zero import (GPT, count_collectives, gather, load_config, load_initial_weights, model_and_data, peer_arguments,
                        report_and_exit, resolve_batch, scheduled_lr, this_rank)


def group_heads_by_rank(qkv, tp):
    """Rows [q | k | v] → [q_0 k_0 v_0 | q_1 k_1 v_1 | ...], so that splitting the rows into tp
    contiguous blocks gives rank r the q, k and v of its own heads (Parallax's parts = 3)."""
    with torch.no_grad():
        for p in (qkv.weight, qkv.bias):
            rest = p.shape[1:]
            p.copy_(p.view(3, tp, p.shape[0] // (3 * tp), *rest).transpose(0, 1).reshape(p.shape).clone())


def split_like_tp_toml(model, mesh, tp):
    for block in model.blocks:
        group_heads_by_rank(block.qkv, tp)
        parallelize_module(block, mesh, {"qkv": ColwiseParallel(), "attn_proj": RowwiseParallel(),
                                         "fc": ColwiseParallel(), "mlp_proj": RowwiseParallel()})
    parallelize_module(model, mesh, {
        "token_embedding": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })


def local(tensor):
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def main():
    args = peer_arguments(__doc__.splitlines()[0], weights_required=True).parse_args()
    rank, world, rendezvous = this_rank("torch_tp")

    config = load_config(args.config, args.overrides)
    train, parallel = config.get("train", {}), config.get("parallel", {})
    tp = parallel.get("tp", 1)
    if parallel.get("pp", 1) != 1 or world % tp != 0:
        raise SystemExit(f"torch_tp.py runs tp x dp: parallel.pp = 1 and tp = {tp} dividing {world} ranks")
    if config.get("tensor_parallel", {}).get("sequence_parallel", False):
        raise SystemExit("torch_tp.py does not run sequence parallelism")
    dp = world // tp
    glob, micro_batch, accum = resolve_batch(train, dp)
    steps, seed = train.get("steps", 100), train.get("seed", 1234)
    m, data = model_and_data(config, seed)
    opt_cfg, sched_cfg = config.get("optimizer", {}), config.get("scheduler", {})

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    # Parallax's mesh: tp innermost, so ranks 2k and 2k+1 form a tensor-parallel pair.
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh.get_local_rank("dp")
    model = GPT(m)
    load_initial_weights(model, args.initial_weights)
    if tp > 1:
        split_like_tp_toml(model, mesh["tp"], tp)
    params = list(model.parameters())
    kind = opt_cfg.get("type", "adamw")
    optimizer = (torch.optim.AdamW if kind == "adamw" else torch.optim.Adam)(
        params, lr=opt_cfg.get("lr", 3e-4), betas=tuple(opt_cfg.get("betas", (0.9, 0.999))),
        eps=opt_cfg.get("eps", 1e-8), weight_decay=opt_cfg.get("weight_decay", 0.0), foreach=False)
    grad_clip = opt_cfg.get("grad_clip", 0.0)

    def batches_of(step):
        return [data.batch(step * glob + (i * dp + dp_rank) * micro_batch, micro_batch) for i in range(accum)]

    def train_step(step, batches):
        """One optimizer step; returns the sum of its micro-batches' losses on this rank."""
        loss_sum = torch.zeros(())
        for inputs, targets in batches:
            with loss_parallel():
                logits = model(inputs)
                micro_loss = F.cross_entropy(logits.reshape(-1, m["vocab_size"]), targets.reshape(-1))
                (micro_loss / accum).backward()
            loss_sum += local(micro_loss.detach()).clone()
        grads = [local(p.grad) for p in params]
        # Gradients sharded over tp. Whole ones are counted once: the replicated parameters',
        # the row-parallel biases' (Replicate DTensors), and the vocabulary-split embedding's,
        # whose gradient DTensor hands back whole (Replicate).
        split = [isinstance(p.grad, DTensor) and any(isinstance(x, Shard) for x in p.grad.placements)
                 for p in params]
        if dp > 1:
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=mesh["dp"].get_group())
            flat /= dp
            for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                g.copy_(reduced)
        if grad_clip > 0:
            # Split parameters' parts summed over tp; replicated ones counted once.
            squares = torch.zeros((), dtype=torch.float64)
            for g, is_split in zip(grads, split):
                if is_split:
                    squares += g.double().pow(2).sum()
            if tp > 1:
                dist.all_reduce(squares, group=mesh["tp"].get_group())
            for g, is_split in zip(grads, split):
                if not is_split:
                    squares += g.double().pow(2).sum()
            norm = math.sqrt(squares.item())
            if norm > grad_clip:
                for g in grads:
                    g.mul_(grad_clip / (norm + 1e-6))
        for group in optimizer.param_groups:
            group["lr"] = scheduled_lr(opt_cfg, sched_cfg, steps, step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        return loss_sum

    step_ms, losses = [], []
    for step in range(steps):
        batches = batches_of(step)  # made before the clock starts, as bench_zero_step does
        start = time.perf_counter()
        loss_sum = train_step(step, batches)
        dist.all_reduce(loss_sum)  # every tp rank holds the same loss: the mean over dp (not counted below)
        losses.append(loss_sum.item() / (accum * world))
        step_ms.append((time.perf_counter() - start) * 1000.0)

    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    # One more step, profiled, for the bytes a step communicates (after the figures above).
    last = batches_of(steps - 1)
    comm_bytes, comm_calls = count_collectives(lambda: train_step(steps - 1, last), world)
    all_rss = gather([rss_mib], torch.float64).view(-1).tolist()
    all_comm = gather([comm_bytes, comm_calls], torch.float64).tolist()
    report_and_exit(rank, {"impl": "torch-dtensor", "tp": tp, "ranks": world,
                           "peak_rss_mib": [round(r, 1) for r in all_rss],
                           "comm_bytes_per_step": [round(c[0]) for c in all_comm],
                           "comm_calls_per_step": [c[1] for c in all_comm]}, step_ms, losses, rendezvous)

if __name__ == "__main__":
    main()
