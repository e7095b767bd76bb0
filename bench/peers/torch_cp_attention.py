#!/usr/bin/env python3
"""The PyTorch peers of bench_context_attention: one causal attention layer (forward and
backward) on this rank's part of a sequence, split over the ranks of the mpirun job, with
PyTorch 2.11 on CPU over gloo. Same shapes, same timing (an iteration starts at a
barrier; its time is the slowest rank's; the median is printed), same table rows.

  whole sequence, 1 rank    the layer on the whole sequence, on every rank alone at once
  torch all-to-all, math    Ulysses written with torch.distributed.nn's all_to_all_single
                            (autograd through the exchange), attention as Parallax
                            computes it (matmul, masked softmax, matmul)
  torch all-to-all, SDPA    the same with F.scaled_dot_product_attention's CPU kernel
  torch context_parallel    torch.distributed.tensor.experimental.context_parallel (ring):
                            its handlers cover the CUDA attention kernels only (flash,
                            efficient, cuDNN); on CPU the row says what happened

  mpirun -np 4 python3 bench/peers/torch_cp_attention.py [--seq 2048] [--batch 1]
                                                          [--heads 8] [--head-dim 64] [--iters 5]
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_zero import this_rank, timed  # noqa: E402


def math_attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    return torch.matmul(torch.softmax(scores.masked_fill(future, float("-inf")), -1), v)


def sdpa_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sequence_to_heads(x, cp):
    """[B, H, S/cp, D] of this rank's positions → [B, H/cp, S, D] of this rank's heads."""
    b, h, s, d = x.shape
    chunks = x.reshape(b, cp, h // cp, s, d).permute(1, 0, 2, 3, 4).contiguous()
    out = dist_fn.all_to_all_single(torch.empty_like(chunks), chunks)
    return out.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def heads_to_sequence(x, cp):
    """The inverse: [B, H/cp, S, D] → [B, H, S/cp, D]."""
    b, hl, full, d = x.shape
    chunks = x.reshape(b, hl, cp, full // cp, d).permute(2, 0, 1, 3, 4).contiguous()
    out = dist_fn.all_to_all_single(torch.empty_like(chunks), chunks)
    return out.permute(1, 0, 2, 3, 4).reshape(b, cp * hl, full // cp, d)


def ulysses(attention, q, k, v, cp):
    y = attention(sequence_to_heads(q, cp), sequence_to_heads(k, cp), sequence_to_heads(v, cp))
    return heads_to_sequence(y, cp)


def try_torch_context_parallel(args, cp, leaf):
    """One forward and backward through torch's experimental context_parallel on a CPU mesh;
    the seconds, or the reason it does not run here."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        mesh = init_device_mesh("cpu", (cp,))
        # The whole sequence's q, k, v as buffers it shards in place (and restores after).
        q, k, v = (torch.randn(args.batch, args.heads, args.seq, args.head_dim) for _ in range(3))

        def body():
            with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
                sdpa_attention(*(t.detach().requires_grad_(True) for t in (q, k, v))).sum().backward()

        return timed(args.iters, body), ""
    except Exception as error:  # what stops it on CPU, reported, not hidden
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"


def main():
    parser = argparse.ArgumentParser()
    for flag, default in (("--seq", 2048), ("--batch", 1), ("--heads", 8), ("--head-dim", 64), ("--iters", 5)):
        parser.add_argument(flag, type=int, default=default)
    args = parser.parse_args()
    rank, cp, rendezvous = this_rank("torch_cp_attention")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=cp)
    torch.manual_seed(1 + rank)

    def leaf(sizes):
        return torch.randn(sizes).requires_grad_(True)

    local = args.seq // cp
    rows = [("whole sequence, 1 rank",
             timed(args.iters, lambda: math_attention(*(leaf([args.batch, args.heads, args.seq, args.head_dim])
                                                        for _ in range(3))).sum().backward()), "")]
    if args.heads % cp == 0:
        for name, attention in (("torch all-to-all, math", math_attention), ("torch all-to-all, SDPA", sdpa_attention)):
            def body(attention=attention):
                q, k, v = (leaf([args.batch, args.heads, local, args.head_dim]) for _ in range(3))
                ulysses(attention, q, k, v, cp).sum().backward()
            rows.append((name, timed(args.iters, body), ""))
    seconds, why = try_torch_context_parallel(args, cp, leaf)
    rows.append(("torch context_parallel", seconds, why))
    if rank == 0:
        print(f"PyTorch {torch.__version__}, causal attention, batch {args.batch}, heads {args.heads}, "
              f"head_dim {args.head_dim}, sequence {args.seq}, cp = {cp}")
        whole = rows[0][1]
        for name, seconds, why in rows:
            if seconds is None:
                print(f"{name:<24} {'-':>10} {'-':>12}   does not run on CPU: {why}")
            else:
                print(f"{name:<24} {seconds * 1e3:10.2f} {whole / seconds:11.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
