"""DeepSpeed's gradient reduce buckets, counted on real engines (tests/integration/test_plan_ds_buffers.py,
started by torchrun with 2 gloo ranks). Not a test module itself: it writes one JSON file per rank.

For each case, rank by rank: a small GPT, deepspeed.initialize with the config ScaleLab's own
ZeRO plan builds (strategies/deepspeed.py `deepspeed_config`) and two optimizer steps. Recorded:
- `allocated`: the bytes of the bucket buffers DeepSpeed holds. ZeRO-1/2 allocate them at the
  start of each backward (`setup_buckets`, wrapped here to read them right after) and free them
  after the step; ZeRO-3 allocates its one buffer at init (`ipg_buckets[dtype].buffer`).
- `flattened`: the largest set of gradients ZeRO-1/2 flatten into a new tensor to reduce it
  (`allreduce_bucket`, wrapped). Without contiguous_gradients that is each bucket's gradients;
  with it, at 2+ ranks, the buffer's slices per destination rank (average_tensor), at the end
  of backward.
- `offload_temp`: ZeRO-1/2 offload's staging copies of the largest parameter's gradient (one on the
  device, one pinned in host memory: temp_grad_buffer_for_{gpu,cpu}_offload).
- `params`, `largest_param`: the model's parameter count and largest tensor.
- `grads_in_forward`, `buckets_in_forward`: the gradient bytes (module .grad, ZeRO-1/2's
  grads_in_partition and averaged_gradients, ZeRO-3's grad_partitions_flat_buffer) and bucket
  bytes alive at the end of a forward after two steps, where the activations peak
  (plan.model_states.grads_at_peak).
"""
from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

CASES = {   # name: (stage, strategy options, precision)
    "zero1": (1, {}, "32-true"),
    "zero1_bf16": (1, {}, "bf16-mixed"),
    "zero2": (2, {}, "32-true"),
    "zero2_bf16": (2, {}, "bf16-mixed"),
    "zero2_bucket_1e5": (2, {"reduce_bucket_size": 100_000}, "32-true"),
    "zero2_bucket_5e3": (2, {"reduce_bucket_size": 5_000}, "32-true"),   # below Psi: several buckets
    "zero2_no_overlap": (2, {"overlap_comm": False}, "32-true"),
    "zero2_not_contiguous": (2, {"contiguous_gradients": False}, "32-true"),
    # offload (torch's AdamW on the host partition: zero_force_ds_cpu_optimizer off, no CPU Adam build)
    "zero2_offload_not_contiguous": (2, {"offload_optimizer": "cpu", "contiguous_gradients": False}, "32-true"),
    "zero3": (3, {}, "32-true"),
    "zero3_bf16": (3, {}, "bf16-mixed"),
    "zero3_bucket_1e6": (3, {"reduce_bucket_size": 1_000_000}, "32-true"),
    "zero3_not_contiguous": (3, {"contiguous_gradients": False}, "32-true"),
}


def _bytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    return [t for v in x for t in _tensors(v)] if isinstance(x, (list, tuple)) else []


def _alive(opt, net) -> tuple[int, int, int]:
    """(gradient bytes, bucket bytes, fp32 gradient partition bytes of an offloaded optimizer: host
    memory) held now; storages counted once. Gradients: each parameter's .grad and grad_accum,
    ZeRO-1/2's grads_in_partition, averaged_gradients and all_grad_tensors (kept across micro-batches
    under accumulation), ZeRO-3's grad_partitions_flat_buffer, bf16_optimizer's flat fp32 gradients."""
    grads = [t for p in net.parameters() for t in (p.grad, getattr(p, "grad_accum", None))]
    for name in ("grads_in_partition", "averaged_gradients", "all_grad_tensors", "grad_partitions_flat_buffer",
                 "fp32_groups_gradients_flat"):
        grads += _tensors(getattr(opt, name, None))
    buckets = [t for b in getattr(opt, "ipg_buckets", {}).values() for t in _tensors(getattr(b, "buffer", None))]
    fp32 = [g.grad for g in getattr(opt, "single_partition_of_fp32_groups", [])]

    def unique(ts):
        seen = {}
        for t in ts:
            if isinstance(t, torch.Tensor) and t.numel():
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(seen.values())
    return unique(grads), unique(buckets), unique(fp32)


def main(out: str, names: str = "all") -> None:
    from scalelab.strategies.deepspeed_cpu import select_cpu_accelerator, skip_shm_comm_build

    select_cpu_accelerator()   # before deepspeed is imported
    import deepspeed
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from scalelab.models.gpt import GPT, GPTConfig
    from scalelab.strategies.deepspeed import ZeRO

    dist.init_process_group("gloo")
    skip_shm_comm_build()   # the inference-only op: a compile, not part of what is measured
    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    seen = {"allocated": 0, "flattened": 0}

    setup_buckets, allreduce_bucket = DeepSpeedZeroOptimizer.setup_buckets, DeepSpeedZeroOptimizer.allreduce_bucket

    def counted_setup(self, *a, **k):
        r = setup_buckets(self, *a, **k)
        held = sum(_bytes(b) for bucket in self.ipg_buckets.values() for b in bucket.buffer)
        seen["allocated"] = max(seen["allocated"], held)
        return r

    def counted_allreduce(self, bucket, *a, **k):
        # it flattens `bucket` (_flatten_dense_tensors): a copy of several tensors; one tensor (the
        # contiguous buffer's view) is only viewed
        if len(bucket) > 1:
            seen["flattened"] = max(seen["flattened"], sum(_bytes(t) for t in bucket))
        return allreduce_bucket(self, bucket, *a, **k)

    reduce_hook = DeepSpeedZeroOptimizer.reduce_independent_p_g_buckets_and_remove_grads

    def counted_hook(self, param, *a, **k):
        # gradient elements that reached the hook before the partition existed (first backward)
        if getattr(self, "grads_in_partition", None) is None and not seen.get("partition_seen"):
            seen["elements_before_partition"] = seen.get("elements_before_partition", 0) + param.numel()
        r = reduce_hook(self, param, *a, **k)
        if getattr(self, "grads_in_partition", None) is not None and not seen.get("partition_seen"):
            seen["partition_seen"] = True
            seen["elements_before_partition"] -= param.numel()   # this one arrived with it
        return r

    DeepSpeedZeroOptimizer.reduce_independent_p_g_buckets_and_remove_grads = counted_hook
    DeepSpeedZeroOptimizer.setup_buckets = counted_setup
    DeepSpeedZeroOptimizer.allreduce_bucket = counted_allreduce

    result = {}
    for name in (CASES if names == "all" else names.split(",")):
        stage, options, precision = CASES[name]
        seen.update(allocated=0, flattened=0, elements_before_partition=0, partition_seen=False)
        torch.manual_seed(0)
        net = GPT(GPTConfig(n_layers=2, n_heads=2, d_model=32, seq_len=16, vocab_size=64))
        n_params = sum(p.numel() for p in net.parameters())
        plan = ZeRO(name=name, stage=stage, **options)
        config = plan.deepspeed_config(SimpleNamespace(batch=None, precision=precision))
        config["train_micro_batch_size_per_gpu"] = 2
        if plan.offload_optimizer != "none":
            config["zero_force_ds_cpu_optimizer"] = False
        engine, opt, _, _ = deepspeed.initialize(
            model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=1e-3), config=config)
        dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
        for step in range(3):
            idx = torch.randint(0, 64, (2, 16))
            logits = engine(idx)
            if step == 2:   # the third forward's end: what the first two steps left alive
                grads_in_forward, buckets_in_forward, fp32_grads_in_forward = _alive(opt, net)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
            engine.backward(loss)
            engine.step()
        if stage == 3:
            seen["allocated"] = sum(_bytes(getattr(b, "buffer", None)) for b in opt.ipg_buckets.values())
        offload_temp = sum(_bytes(getattr(opt, k, None)) for k in
                           ("temp_grad_buffer_for_gpu_offload", "temp_grad_buffer_for_cpu_offload"))
        result[name] = {**seen, "params": n_params, "param_dtype": str(dtype), "offload_temp": offload_temp,
                        "largest_param": max(p.numel() for p in net.parameters()),
                        "grads_in_forward": grads_in_forward, "buckets_in_forward": buckets_in_forward,
                        "fp32_grads_in_forward": fp32_grads_in_forward}
        del engine, opt, net
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    # DeepSpeed's engines leave threads that abort a normal interpreter exit ("terminate called
    # without an active exception"); the results are written, so leave at once.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "all")   # argv[2]: comma-separated cases
