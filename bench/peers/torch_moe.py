#!/usr/bin/env python3
"""The PyTorch peer of bench_moe_layer: one mixture-of-experts layer (forward and
backward) with its experts shared out over the ranks of the mpirun job, written with
PyTorch 2.11's torch.distributed on CPU over gloo, as torchtitan's expert-parallel path
does it: route, sort the choices by expert, exchange the per-expert counts with an
all_to_all_single, move the token rows with torch.distributed.nn's all_to_all_single
(autograd through the exchange), run the local experts one after another, move the
outputs back and add them into their tokens. Same shapes, router (softmax top-k), experts
(fc2(gelu(fc1(x))) with biases), auxiliary loss weight and timing as bench_moe_layer (an
iteration starts at a barrier; its time is the slowest rank's; the median is printed).

  every expert on every rank   each rank routes its tokens to all experts, locally
  torch ep = N                 the experts over the N ranks, all-to-all as above

  mpirun -np 4 python3 bench/peers/torch_moe.py [--tokens 1024] [--hidden 256] [--ffn 512]
                                                [--experts 8] [--top-k 2] [--iters 11]
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_zero import this_rank, timed  # noqa: E402


class Moe(torch.nn.Module):
    def __init__(self, hidden, ffn, experts, top_k, first, local, aux_coef, exchange):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(hidden, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, hidden))
            for _ in range(local))
        self.n_experts, self.top_k, self.first, self.local = experts, top_k, first, local
        self.aux_coef, self.exchange = aux_coef, exchange

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.gate(tokens), -1)
        weight, expert = torch.topk(probs, self.top_k, -1)
        counts = torch.bincount(expert.reshape(-1), minlength=self.n_experts)
        # Switch's load-balancing loss over the whole group's choices.
        group = counts.clone()
        if self.exchange:
            dist.all_reduce(group)
        fraction = group.double() / group.sum()
        aux = self.n_experts * (fraction.float() * probs.mean(0)).sum() * self.aux_coef
        order = torch.argsort(expert.reshape(-1), stable=True)
        token = order // self.top_k
        rows = tokens.index_select(0, token)
        if self.exchange:
            ranks = dist.get_world_size()
            received = torch.empty_like(counts)
            dist.all_to_all_single(received, counts)
            send = counts.view(ranks, self.local).sum(1).tolist()
            recv_per = received.view(ranks, self.local)
            recv = recv_per.sum(1).tolist()
            rows = dist_fn.all_to_all_single(rows.new_empty(sum(recv), rows.shape[1]), rows, recv, send)
            # By source then expert → by expert then source.
            starts = torch.cat([torch.zeros(1, dtype=torch.long), recv_per.reshape(-1).cumsum(0)])
            pieces = [torch.arange(starts[s * self.local + e], starts[s * self.local + e + 1])
                      for e in range(self.local) for s in range(ranks)]
            to_expert = torch.cat(pieces)
            rows = rows.index_select(0, to_expert)
            per_expert = recv_per.sum(0).tolist()
        else:
            per_expert = counts.tolist()
        outputs, at = [], 0
        for e, n in enumerate(per_expert):
            outputs.append(self.experts[e](rows[at:at + n]))
            at += n
        out = torch.cat(outputs)
        if self.exchange:
            back = torch.empty_like(to_expert)
            back[to_expert] = torch.arange(to_expert.numel())
            out = dist_fn.all_to_all_single(out.new_empty(sum(send), out.shape[1]), out.index_select(0, back),
                                            send, recv)
        scaled = out * weight.reshape(-1).index_select(0, order).unsqueeze(1)
        combined = torch.zeros_like(tokens).index_add(0, token, scaled)
        return combined.view_as(x), aux


def main():
    parser = argparse.ArgumentParser()
    for flag, default in [("--tokens", 1024), ("--hidden", 256), ("--ffn", 512), ("--experts", 8),
                          ("--top-k", 2), ("--iters", 11)]:
        parser.add_argument(flag, type=int, default=default)
    o = parser.parse_args()
    rank, ranks, rendezvous = this_rank("torch_moe")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=ranks)
    torch.manual_seed(1)
    local = Moe(o.hidden, o.ffn, o.experts, o.top_k, 0, o.experts, 0.01, exchange=False)
    per_rank = o.experts // ranks
    spread = Moe(o.hidden, o.ffn, o.experts, o.top_k, rank * per_rank, per_rank, 0.01, exchange=True)
    torch.manual_seed(2 + rank)
    x = torch.randn(1, o.tokens, o.hidden)

    def step(layer):
        inp = x.detach().requires_grad_(True)
        out, aux = layer(inp)
        (out.sum() + aux).backward()
        layer.zero_grad()

    replicated = timed(o.iters, lambda: step(local))
    expert_parallel = timed(o.iters, lambda: step(spread))
    if rank == 0:
        print(f"{'torch every expert on every rank':<34} {replicated * 1e3:10.2f}")
        print(f"{'torch ep = ' + str(ranks):<34} {expert_parallel * 1e3:10.2f}")
    dist.destroy_process_group()
    if rank == 0 and os.path.exists(rendezvous):
        os.remove(rendezvous)


if __name__ == "__main__":
    main()
