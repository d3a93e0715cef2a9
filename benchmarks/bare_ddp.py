"""The bare baseline: a hand-written torch DDP loop under torchrun, on the platform's own GPT.

    python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/bare_ddp.py \
        --layers 2 --width 64 --heads 4 --seq-len 64 --batch 16 --steps 30 --warmup 5

gloo (CPU) or NCCL (GPU), the same byte corpus the platform prepared (its cached Arrow blocks,
--data) or random bytes, each rank its 1/N of every global batch, AdamW, one thread per rank on
CPU. Rank 0 prints one JSON line: wall-clock marks (epoch s: process start, imports done, model
built, first and last optimizer step, exit) and the steady step times (warm-up excluded), which
benchmarks/startup.py and benchmarks/run_all.py compare with the platform's run.json. As there,
the step times are the slowest rank's (each rank times its own steps; the rank whose steady steps
took longest in all, gathered once after training, no collective in the loop): `step_s_median` and
`samples_per_s`; rank 0's own figures are
`rank0_step_s_median` and `rank0_samples_per_s`.
"""
from __future__ import annotations

import time

_T_IMPORTS = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from scalelab.models.gpt import GPT, GPTConfig  # noqa: E402
from scalelab.timing import process_start_time  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="global batch")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    marks = {"rank_process_start": process_start_time(), "imports_done": time.time()}
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(a.threads)
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    torch.manual_seed(1234)
    net = GPT(GPTConfig(n_layers=a.layers, n_heads=a.heads, d_model=a.width, seq_len=a.seq_len)).to(dev)
    model = DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    marks["model_built"] = time.time()
    g = torch.Generator().manual_seed(1234)
    micro = a.batch // world
    times, t_last = [], time.perf_counter()
    for step in range(a.steps):
        x = torch.randint(0, 256, (a.batch, a.seq_len + 1), generator=g)[rank * micro:(rank + 1) * micro].to(dev)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()                                    # as the platform: the step ends on the host
        now = time.perf_counter()
        times.append(now - t_last)
        t_last = now
        if step == 0:
            marks["first_step"] = time.time()
    marks["last_step"] = time.time()
    # The run goes as fast as its slowest rank (as the platform's run.json counts it): the step
    # times of the rank whose steady steps took longest in all, exchanged once AFTER training (no
    # collective in the loop). (A max per step summed to more than any rank's elapsed time.)
    every = [times]
    if world > 1:   # tensors on the rank's own device (all_gather_object's go to the current one)
        mine = torch.tensor(times, dtype=torch.float64, device=dev)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        every = [t.cpu().tolist() for t in gathered]
    slowest = max(every, key=lambda t: sum(t[a.warmup:]))
    steady, steady0 = slowest[a.warmup:], times[a.warmup:]
    out = {"marks": marks, "step_s_median": statistics.median(steady),
           "samples_per_s": a.batch * len(steady) / sum(steady),
           "rank0_step_s_median": statistics.median(steady0),
           "rank0_samples_per_s": a.batch * len(steady0) / sum(steady0),
           "measured_steps": len(steady), "steps": a.steps, "world_size": world,
           "step_time_method": "the slowest rank's own steps (the largest steady sum; all_gather after "
                                   "training), steady steps"}
    del model, opt, net
    import gc

    gc.collect()   # the gloo exit abort (shared/notes/cpu-strategies.md section 1): no refs, barrier, destroy
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out["marks"]["exit"] = time.time()
        print("BARE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
