"""What DeepSpeed ZeRO-3 keeps gathered at the end of a forward, on real engines
(tests/integration/test_plan_zero3_reuse.py, started by torchrun with 2 gloo ranks). Not a test
module itself: it writes one JSON file per rank.

For each case (fetch unit, stage3_max_reuse_distance, stage3_prefetch_bucket_size,
stage3_max_live_parameters): a 4-layer
GPT with every tensor partitioned (stage3_param_persistence_threshold 0), deepspeed.initialize
with the config ScaleLab's ZeRO plan builds, four steps (the first records DeepSpeed's trace);
at the end of the fourth forward: the elements of the parameters that are gathered or being
gathered (status not NOT_AVAILABLE, or in the coordinator's in-flight registry: their all-gather
buffer is allocated, the parameter's storage is set when its module waits for it), of those the
in-flight ones, and the bytes of their storages. argv[2]: comma-separated case names ("all": every case).
"""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

LIVE = 1_000_000_000   # stage3_max_live_parameters' default
CASES = {f"{unit}_r{r}_p{p}" + (f"_l{live}" if live != LIVE else ""): (unit, r, p, live)
         for unit in ("module", "block")
         for r, p, live in ((0, 0, LIVE), (20_000, 0, LIVE), (40_000, 0, LIVE), (60_000, 0, LIVE),
                            (80_000, 0, LIVE), (1_000_000_000, 0, LIVE), (0, 10_000, LIVE), (0, 30_000, LIVE),
                            (1_000_000_000, 50_000_000, LIVE),
                            # the prefetcher stops at max live parameters gathered: what bounds big models
                            (0, 50_000_000, 20_000), (0, 50_000_000, 30_000), (20_000, 50_000_000, 20_000))}
SHAPE = dict(n_layers=4, n_heads=2, d_model=32, seq_len=16, vocab_size=64)


def main(out: str, names: str) -> None:
    from scalelab.strategies.deepspeed_cpu import select_cpu_accelerator, skip_shm_comm_build

    select_cpu_accelerator()   # before deepspeed is imported
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from scalelab.models.gpt import GPT, GPTConfig
    from scalelab.strategies.deepspeed import ZeRO

    dist.init_process_group("gloo")
    skip_shm_comm_build()   # the inference-only op: a compile, not part of what is measured
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    result = {}
    for name in (CASES if names == "all" else names.split(",")):
        unit, reuse, prefetch, live = CASES[name]
        torch.manual_seed(0)
        net = GPT(GPTConfig(**SHAPE))
        plan = ZeRO(name=name, stage=3, stage3_param_persistence_threshold=0, stage3_max_reuse_distance=reuse,
                    stage3_prefetch_bucket_size=prefetch, stage3_max_live_parameters=live,
                    stage3_fetch_unit=unit)
        config = plan.deepspeed_config(SimpleNamespace(batch=None, precision="32-true"))
        config["train_micro_batch_size_per_gpu"] = 2
        engine, opt, _, _ = deepspeed.initialize(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=1e-3),
                                                 config=config)
        coordinator = opt.parameter_offload.get_param_coordinator()
        for step in range(4):
            idx = torch.randint(0, 64, (2, 16))
            logits = engine(idx)
            if step == 3:
                inflight = coordinator._PartitionedParameterCoordinator__inflight_param_registry
                held = [p for p in net.parameters()
                        if p.ds_status != ZeroParamStatus.NOT_AVAILABLE or p in inflight]
                result[name] = {"elements": sum(p.ds_numel for p in held),
                                "inflight_elements": sum(p.ds_numel for p in held if p.ds_status != ZeroParamStatus.AVAILABLE),
                                "storage_bytes": sum(p.untyped_storage().nbytes() for p in held),
                                "params": sum(p.ds_numel for p in net.parameters())}
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
            engine.backward(loss)
            engine.step()
        del engine, opt, net
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    os._exit(0)   # DeepSpeed's engines leave threads that abort a normal interpreter exit


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "all")
