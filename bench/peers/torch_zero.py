#!/usr/bin/env python3
"""The PyTorch peer of bench_zero_step: the same GPT, data and batch, trained with
torch.distributed (gloo) under DistributedDataParallel (--mode ddp), DDP plus
ZeroRedundancyOptimizer (--mode zero1, optimizer state sharded like ZeRO stage 1), or
FSDP2 (--mode fsdp2: fully_shard on each block, then the root, over a CPU device mesh;
parameters, gradients and optimizer state sharded like ZeRO stage 3; PyTorch 2.6+).

It reads the same TOML as train_gpt (--config FILE..., extends, --set key.path=value),
builds the model of examples/gpt/gpt.cpp with the same parameter names and order, loads
the initial weights bench_zero_step wrote (--initial-weights, so both sides start from
the same parameters; without it the model is initialized here), makes the same synthetic token
stream (samples are a pure function of seed and index) and runs the engine's loop:
grad_accum micro-steps, the last one reducing gradients, global-norm clipping, the
optimizer at the scheduled learning rate, the step's mean loss over the global batch.

It prints the JSON line bench_zero_step prints (every step's loss in "losses"), with
"impl" "torch-ddp", "torch-zero1" or "torch-fsdp2": per step the slowest rank's wall time from the first forward to the end
of the optimizer step, the median after 2 warm-up steps, ru_maxrss per rank in MiB,
the parameter, gradient and optimizer-state bytes each rank holds, and the bytes and
calls of one step's collectives per rank (comm_bytes_per_step, comm_calls_per_step:
counted by torch.profiler in one more step after the timed ones, as Parallax's engine
counts its own; the loss's all-reduce, which the engine does on its metrics group, is
left out on both sides).

  mpirun -np 4 python3 bench/peers/torch_zero.py --mode ddp --config configs/gpt_base.toml \
      --rendezvous /tmp/x/rdzv --set train.steps=12

Ranks meet through a file (--rendezvous: a path that does not exist yet, on a file
system every rank sees); gloo talks over the loopback interface only.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import tomllib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

WARMUP_STEPS = 2
# The profiler's dtype names (c10's C++ type names) of the tensors collectives carry.
DTYPES = {"float": torch.float32, "double": torch.float64, "c10::BFloat16": torch.bfloat16, "c10::Half": torch.float16,
          "long int": torch.int64, "int": torch.int32, "unsigned char": torch.uint8, "bool": torch.bool}
MASK64 = (1 << 64) - 1


# ---- Config: the subset of Parallax's loader this peer needs --------------------------

def merge_into(base, overlay):
    """Tables merge key by key; any other value replaces (as the C++ loader does)."""
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_into(base[key], value)
        else:
            base[key] = value
    return base


def load_file(path):
    with open(path, "rb") as f:
        document = tomllib.load(f)
    merged = {}
    extends = document.pop("extends", None)
    for name in [extends] if isinstance(extends, str) else (extends or []):
        merge_into(merged, load_file(os.path.join(os.path.dirname(path), name)))
    return merge_into(merged, document)


def parse_override(text):
    """key.path=value; the value is TOML, or a bare word taken as a string."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise SystemExit(f"--set {text}: expected key.path=value")
    try:
        return tomllib.loads(f"{key.strip()} = {value}")
    except tomllib.TOMLDecodeError:
        return tomllib.loads(f"{key.strip()} = {json.dumps(value.strip())}")


def load_config(files, overrides):
    config = {}
    for path in files:
        merge_into(config, load_file(path))
    for text in overrides:
        merge_into(config, parse_override(text))
    return config


def resolve_batch(train, dp):
    """global = micro × accum × dp; one omitted value is inferred (Config::resolve)."""
    glob, micro, accum = (train.get(k, 0) for k in ("global_batch_size", "micro_batch_size", "grad_accum"))
    if (glob == 0) + (micro == 0) + (accum == 0) >= 2 and accum == 0:
        accum = 1
    if glob == 0:
        glob = micro * accum * dp
    elif micro == 0:
        micro = glob // (accum * dp)
    elif accum == 0:
        accum = glob // (micro * dp)
    if micro * accum * dp != glob or micro == 0:
        raise SystemExit(f"train: global_batch_size {glob} != micro_batch_size {micro} × grad_accum {accum} × dp {dp}")
    return glob, micro, accum


def scheduled_lr(optimizer, scheduler, total_steps, step):
    """runtime/optimizer.cpp's scheduled_lr: linear warmup, then constant/linear/cosine."""
    peak = optimizer.get("lr", 3e-4)
    warmup = scheduler.get("warmup_steps", 0)
    if step < warmup:
        return peak * (step + 1) / warmup
    kind = scheduler.get("type", "constant")
    if kind == "constant":
        return peak
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    floor = scheduler.get("min_lr", 0.0)
    if kind == "linear":
        return peak - (peak - floor) * progress
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


# ---- Model and data: examples/gpt/gpt.cpp in PyTorch ---------------------------------

class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, d_ff = m["d_model"], m["d_ff"] or 4 * m["d_model"]
        self.n_head = m["n_head"]
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d_ff)
        self.mlp_proj = nn.Linear(d_ff, d)

    def forward(self, x):
        # Heads are counted from qkv's output, so a tensor-parallel rank holding some of
        # them (torch_tp.py) runs the same code on its part.
        batch, seq, d = x.shape
        head_dim = d // self.n_head
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        width = q.size(-1)
        heads = lambda t: t.reshape(batch, seq, width // head_dim, head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        attention = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        y = torch.matmul(attention, v).transpose(1, 2).contiguous().view(batch, seq, width)
        h = x + self.attn_proj(y)
        return h + self.mlp_proj(F.gelu(self.fc(self.ln2(h))))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.token_embedding = nn.Embedding(m["vocab_size"], m["d_model"])
        self.position_embedding = nn.Embedding(m["block_size"], m["d_model"])
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["n_layer"]))
        self.ln_f = nn.LayerNorm(m["d_model"])
        self.head = nn.Linear(m["d_model"], m["vocab_size"], bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), dtype=torch.long)
        x = self.token_embedding(tokens) + self.position_embedding(positions).unsqueeze(0)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def mix(x):
    """splitmix64, as in gpt.cpp."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class SyntheticTokens:
    def __init__(self, vocab_size, block_size, seed, noise):
        self.vocab, self.block, self.seed, self.noise = vocab_size, block_size, seed & MASK64, noise
        self.successor = list(range(vocab_size))
        for i in range(vocab_size - 1, 0, -1):
            j = mix(self.seed ^ (0x5EED + i)) % (i + 1)
            self.successor[i], self.successor[j] = self.successor[j], self.successor[i]

    def batch(self, first, count):
        rows = []
        for s in range(count):
            sample = mix(self.seed ^ mix(first + s))
            token, row = sample % self.vocab, []
            for t in range(self.block + 1):
                row.append(token)
                h = mix((sample + t + 1) & MASK64)
                token = mix(h) % self.vocab if (h >> 11) * (1.0 / 9007199254740992.0) < self.noise else self.successor[token]
            rows.append(row)
        tokens = torch.tensor(rows, dtype=torch.long)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


# ---- Training ------------------------------------------------------------------------

def load_initial_weights(model, path):
    """Every parameter from `path`, by name; a missing or extra name, or another shape, is an error."""
    weights = dict(torch.load(path, map_location="cpu"))  # ((name, tensor), ...)
    own = dict(model.named_parameters())
    if set(weights) != set(own):
        raise SystemExit(f"--initial-weights {path}: names differ from this model's: only in the file "
                         f"{sorted(set(weights) - set(own))}, only here {sorted(set(own) - set(weights))}")
    with torch.no_grad():
        for name, value in weights.items():
            if value.shape != own[name].shape:
                raise SystemExit(f"--initial-weights {path}: {name} has shape {tuple(value.shape)}, "
                                 f"the model {tuple(own[name].shape)}")
            own[name].copy_(value)


def no_decay_groups(model, kinds):
    """The parameters optimizer.no_decay exempts, as Parallax picks them: "bias" by name,
    "embedding" by nn.Embedding, "norm" by the normalization modules and any other 1-D
    parameter; returns (decayed, exempt), each a list of parameters."""
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm,
             torch.nn.modules.instancenorm._InstanceNorm)
    decayed, exempt, seen = [], [], set()
    for module in model.modules():
        for key, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if key == "bias":
                kind = "bias"
            elif isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                kind = "embedding"
            elif isinstance(module, norms) or p.dim() == 1:
                kind = "norm"
            else:
                kind = None
            (exempt if kind in kinds else decayed).append(p)
    return decayed, exempt


def make_optimizer(model, o, zero1):
    kind = o.get("type", "adamw")
    kwargs = {"lr": o.get("lr", 3e-4), "weight_decay": o.get("weight_decay", 0.0)}
    if kind == "sgd":
        cls, kwargs["momentum"] = torch.optim.SGD, o.get("momentum", 0.0)
    else:
        cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
        kwargs.update(betas=tuple(o.get("betas", (0.9, 0.999))), eps=o.get("eps", 1e-8))
    params = list(model.parameters())
    if o.get("no_decay"):
        decayed, exempt = no_decay_groups(model, set(o["no_decay"]))
        params = [{"params": decayed}, {"params": exempt, "weight_decay": 0.0}]
    if zero1:
        if isinstance(params[0], dict):
            first, *rest = params
            zero = ZeroRedundancyOptimizer(first["params"], optimizer_class=cls, **kwargs)
            for group in rest:
                zero.add_param_group(group)
            return zero
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, **kwargs)
    return cls(params, **kwargs)


def local_bytes(tensor):
    """Bytes this rank holds of `tensor` (its local shard when FSDP2 made it a DTensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def state_bytes(optimizer):
    """Moment and momentum buffers this rank holds (the local shard under ZeRO and FSDP2)."""
    local = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return sum(local_bytes(v) for s in local.state.values() for k, v in s.items()
               if torch.is_tensor(v) and k != "step")


def fully_shard_blocks(model, world):
    """FSDP2 as Parallax's zero.stage = 3 with wrap = ["Block"]: one unit per block, the
    rest in the root's unit, resharded after forward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def accumulating(model, skip_sync):
    """A micro-step whose gradients are only accumulated (no reduction)."""
    if isinstance(model, DistributedDataParallel):
        return model.no_sync() if skip_sync else contextlib.nullcontext()
    model.set_requires_gradient_sync(not skip_sync)  # FSDP2
    return contextlib.nullcontext()


def peer_arguments(description, weights_required=False):
    """The arguments every peer takes: --config, --set and --initial-weights."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", action="append", default=[], help="TOML file (repeatable; later wins)")
    parser.add_argument("--set", action="append", default=[], dest="overrides", help="key.path=value")
    parser.add_argument("--initial-weights", required=weights_required, help="parameters by name, as "
                        "bench_zero_step --write-initial-weights wrote them (torch.load)")
    return parser


def timed(iters, body):
    """Seconds of the slowest rank, median over iterations (after one warm-up); each
    iteration starts at a barrier (the C++ benches' bench/slowest_rank.h)."""
    body()
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        body()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    times.sort()
    return times[len(times) // 2]


def this_rank(name):
    """(rank, world size, a rendezvous file for this mpirun job) from Open MPI's environment;
    one intra-op thread, as Parallax's ranks on this machine; gloo over the loopback."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    job = os.environ.get("OMPI_MCA_ess_base_jobid", str(os.getppid()))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    return rank, world, os.path.join(tempfile.gettempdir(), f"{name}_rdzv_{job}")


def model_and_data(config, seed):
    """The [model] options (gpt.cpp's defaults) and the [data] stream."""
    m = {"vocab_size": 64, "block_size": 32, "d_model": 64, "n_layer": 2, "n_head": 4, "d_ff": 0}
    m.update(config.get("model", {}))
    return m, SyntheticTokens(m["vocab_size"], m["block_size"], seed, config.get("data", {}).get("noise", 0.1))


def report_and_exit(rank, record, step_ms, losses, rendezvous=None):
    """Prints `record` with the median of the slowest rank's step times after the warm-up,
    the final loss and every step's loss, as bench_zero_step's JSON line, on rank 0; then
    leaves without tearing down: in PyTorch 1.13, DDP's reducer can release the gloo
    process group at interpreter exit while holding the GIL, joining a worker thread that
    waits for the GIL to free a tensor, and the rank hangs. The barrier keeps any rank from
    leaving while a peer still needs it."""
    slowest = gather(step_ms, torch.float64).max(dim=0).values[WARMUP_STEPS:].tolist()
    if rank == 0:
        record = dict(record, median_step_ms=round(statistics.median(slowest), 3),
                      final_loss=round(losses[-1], 6) if math.isfinite(losses[-1]) else None,
                      losses=[float(f"{x:.9g}") if math.isfinite(x) else -1.0 for x in losses])
        print(json.dumps(record), flush=True)
    dist.barrier()
    if rank == 0 and rendezvous:
        with contextlib.suppress(FileNotFoundError):
            os.remove(rendezvous)
    sys.stderr.flush()
    os._exit(0)


def count_collectives(run_step, world):
    """(bytes, calls) of the gloo collectives `run_step` issues on this rank, counted as
    Parallax's engine counts them: an all-reduce or broadcast its tensor, an all-gather
    or reduce-scatter the full buffer (all-gather's input times the group's size), a
    send or receive its message. From one step under torch.profiler (record_shapes: each
    gloo call's tensor shapes and dtypes), run after the timed steps so the profiler costs
    them nothing."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run_step()
    total_bytes, calls = 0, 0
    for event in prof.profiler.kineto_results.events():
        if not event.name().startswith("gloo:"):
            continue
        size = sum(math.prod(shape) * torch.empty((), dtype=DTYPES[dtype]).element_size()
                   for shape, dtype in zip(event.shapes(), event.dtypes()) if dtype in DTYPES)
        total_bytes += size * (world if "gather" in event.name() else 1)
        calls += 1
    return total_bytes, calls


def gather(values, dtype):
    local = torch.tensor(values, dtype=dtype)
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return torch.stack(out)


def main():
    parser = peer_arguments(__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ddp", "zero1", "fsdp2"), required=True)
    parser.add_argument("--rendezvous", help="file for init_method=file:// (must not exist yet); "
                        "default: one per mpirun job in the temp dir")
    args = parser.parse_args()
    rank, world, rendezvous = this_rank("torch_zero")
    rendezvous = args.rendezvous or rendezvous

    config = load_config(args.config, args.overrides)
    train, parallel = config.get("train", {}), config.get("parallel", {})
    if parallel.get("tp", 1) != 1 or parallel.get("pp", 1) != 1 or parallel.get("dp", -1) not in (-1, world):
        raise SystemExit("torch_zero.py runs plain data parallelism: parallel.tp = pp = 1, dp = world size")
    if config.get("precision", {}).get("dtype", "fp32") != "fp32":
        raise SystemExit("torch_zero.py runs fp32 only (precision.dtype = \"fp32\")")
    glob, micro_batch, accum = resolve_batch(train, world)
    steps, seed = train.get("steps", 100), train.get("seed", 1234)
    if steps <= WARMUP_STEPS:
        raise SystemExit(f"train.steps = {steps}: needs more than {WARMUP_STEPS} warm-up steps")
    m, data = model_and_data(config, seed)
    opt_cfg, sched_cfg = config.get("optimizer", {}), config.get("scheduler", {})
    bucket_mb = config.get("zero", {}).get("bucket_mb", 25.0)

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    torch.manual_seed(seed)
    gpt = GPT(m)
    if args.initial_weights:
        load_initial_weights(gpt, args.initial_weights)
    if args.mode == "fsdp2":
        model = fully_shard_blocks(gpt, world)
    else:
        model = DistributedDataParallel(gpt, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True)
    params = list(model.parameters())
    optimizer = make_optimizer(model, opt_cfg, args.mode == "zero1")
    grad_clip = opt_cfg.get("grad_clip", 0.0)

    def batches_of(step):
        return [data.batch(step * glob + (i * world + rank) * micro_batch, micro_batch) for i in range(accum)]

    def train_step(step, batches):
        """One optimizer step; returns the sum of its micro-batches' losses on this rank."""
        loss_sum = torch.zeros(())
        for i, (inputs, targets) in enumerate(batches):
            with accumulating(model, i < accum - 1):
                logits = model(inputs)
                micro_loss = F.cross_entropy(logits.reshape(-1, m["vocab_size"]).float(), targets.reshape(-1))
                (micro_loss / accum).backward()
            loss_sum += micro_loss.detach()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = scheduled_lr(opt_cfg, sched_cfg, steps, step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        return loss_sum

    step_ms, losses, loss = [], [], 0.0
    for step in range(steps):
        batches = batches_of(step)  # made before the clock starts, as bench_zero_step does
        start = time.perf_counter()
        loss_sum = train_step(step, batches)
        dist.all_reduce(loss_sum)  # the engine reports the mean over the global batch (not counted below)
        loss = loss_sum.item() / (accum * world)
        losses.append(loss)
        step_ms.append((time.perf_counter() - start) * 1000.0)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    # One more step, profiled, for the bytes a step communicates (after the figures above).
    last = batches_of(steps - 1)
    comm_bytes, comm_calls = count_collectives(lambda: train_step(steps - 1, last), world)
    state = sum(local_bytes(p) for p in params)
    state += sum(local_bytes(p.grad) for p in params if p.grad is not None)
    state += state_bytes(optimizer)
    all_rss = gather([rss_mib], torch.float64).view(-1).tolist()
    all_state = gather([state], torch.int64).view(-1).tolist()
    all_comm = gather([comm_bytes, comm_calls], torch.float64).tolist()
    report_and_exit(rank, {"impl": f"torch-{args.mode}", "zero_stage": {"ddp": 0, "zero1": 1, "fsdp2": 3}[args.mode],
                           "ranks": world, "peak_rss_mib": [round(r, 1) for r in all_rss],
                           "model_state_bytes": all_state, "comm_bytes_per_step": [round(c[0]) for c in all_comm],
                           "comm_calls_per_step": [c[1] for c in all_comm]}, step_ms, losses, rendezvous)

if __name__ == "__main__":
    main()
