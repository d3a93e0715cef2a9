"""The anchor for strategy figures: a hand-written training loop on the same GPT, no platform.

One process, one device: the project's plain GPT (scalelab.models.gpt, the model every
strategy trains), AdamW (fused on CUDA), autocast to the given precision, random byte batches,
`--steps` optimizer steps of which the first `--warmup` are not timed. On CUDA each step is timed
with events recorded at its boundaries and read once at the end, as the platform's StepMetrics
does (a per-step torch.cuda.synchronize drained the device every step, which `single` does not),
from pinned host batches (as data.pin_memory). Prints one JSON line:
    {"step_s_median", "step_s_p90", "tokens_per_s", "peak_allocated_bytes", "peak_reserved_bytes",
     "model_flops_per_token", "mfu"?, "device", "precision", ...}

    python benchmarks/handwritten_gpt.py --layers 12 --width 768 --heads 12 --seq-len 1024 \
        --batch 16 --precision bf16-mixed --steps 40 --warmup 10 [--peak-flops 989.4e12]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

from scalelab.models.gpt import GPT, GPTConfig, flops_per_token


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--precision", default="bf16-mixed", choices=["32-true", "bf16-mixed", "16-mixed"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--peak-flops", type=float, help="device peak FLOP/s for MFU (optional)")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error(f"--steps {a.steps} must exceed --warmup {a.warmup}")

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.manual_seed(a.seed)
    cfg = GPTConfig(n_layers=a.layers, n_heads=a.heads, d_model=a.width, seq_len=a.seq_len, vocab_size=a.vocab)
    with dev:
        net = GPT(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(dev.type) if dtype is torch.float16 else None
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=g) for _ in range(4)]
    if cuda:   # a copy from pageable memory waits for the device: the platform pins its batches
        batches = [b.pin_memory() for b in batches]
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)] if cuda else []

    def mark(i: int) -> float:
        if cuda:
            marks[i].record()
        return time.perf_counter()

    times, t_last = [], None
    if cuda:
        torch.cuda.synchronize(dev)
    t_last = mark(0)
    for step in range(a.steps):
        x = batches[step % len(batches)].to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            logits = net(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), x[:, 1:].reshape(-1))
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        now = mark(step + 1)
        times.append(now - t_last)
        t_last = now
    if cuda:   # the device's own step times, read once at the end
        torch.cuda.synchronize(dev)
        times = [marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(a.steps)]
    steady = sorted(times[a.warmup:])
    med = statistics.median(steady)
    tokens_per_s = a.batch * a.seq_len * len(steady) / sum(steady)
    out = {"what": "hand-written loop (benchmarks/handwritten_gpt.py)", "device": str(dev),
           "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu", "precision": a.precision,
           "shape": {"layers": a.layers, "width": a.width, "heads": a.heads, "seq_len": a.seq_len,
                     "vocab": a.vocab, "batch": a.batch},
           "steps": a.steps, "warmup": a.warmup, "step_s_median": med,
           "step_s_p90": steady[max(0, math.ceil(0.9 * len(steady)) - 1)],
           "tokens_per_s": tokens_per_s, "loss_final": loss.item(),
           "model_flops_per_token": flops_per_token(cfg)}
    if cuda:
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(dev)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
    if a.peak_flops:
        out["mfu"] = tokens_per_s * flops_per_token(cfg) / a.peak_flops
    print(json.dumps(out))


if __name__ == "__main__":
    main()
