"""A probe of FSDP2 under torch.distributed.pipelining, for tests/integration/test_nd_fsdp_pipeline.py:
`strategy=nd strategy._target_=tests.nd_probe.ProbedND` runs the real `nd` strategy and writes,
per rank, $ND_PROBE_OUT/rank{r}.json with the events of the schedule:
- ("fwd", fqn, gathered, grad_bytes): at each Block's forward, before FSDP2's own pre-forward
  hook: whether the Block's group is still gathered, and the bytes of its unsharded gradients;
- ("fwd_end", fqn, gathered): after the Block's forward and FSDP2's post-forward hook;
- ("reduce",): each FSDP2 gradient reduce-scatter (foreach_reduce);
- ("step",): each end of a schedule step (PipelineStage.perform_reduce_grad's return).
"""
from __future__ import annotations

import json
import os

from scalelab.strategies.nd import ND


class ProbedND(ND):
    def parallelize(self, net, device_mesh):
        net = super().parallelize(net, device_mesh)
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
        from torch.distributed.pipelining import stage as stage_mod

        from scalelab.models.gpt import Block

        out = os.environ["ND_PROBE_OUT"]
        events: list = []
        path = os.path.join(out, f"rank{dist.get_rank()}.json")

        def save():
            with open(path, "w") as f:
                json.dump(events, f)

        for name, m in net.named_modules():
            if isinstance(m, Block):
                def hook(module, args, name=name):
                    group = _get_module_fsdp_state(module)._fsdp_param_group
                    grads = sum(p._unsharded_param.grad.numel() * p._unsharded_param.grad.element_size()
                                for p in group.fsdp_params
                                if getattr(p, "_unsharded_param", None) is not None
                                and p._unsharded_param.grad is not None)
                    grads += sum(p.unsharded_accumulated_grad.numel() * p.unsharded_accumulated_grad.element_size()
                                 for p in group.fsdp_params if p.unsharded_accumulated_grad is not None)
                    events.append(("fwd", name, group.is_unsharded, grads))
                m.register_forward_pre_hook(hook, prepend=True)

                def after(module, args, output, name=name):   # after FSDP2's own post-forward hook
                    events.append(("fwd_end", name, _get_module_fsdp_state(module)._fsdp_param_group.is_unsharded))
                m.register_forward_hook(after)

        real_reduce = pg.foreach_reduce

        def reduce(*a, **k):
            events.append(("reduce",))
            return real_reduce(*a, **k)
        pg.foreach_reduce = reduce
        real_end = stage_mod._PipelineStageBase.perform_reduce_grad

        def end(self, *a, **k):
            r = real_end(self, *a, **k)
            events.append(("step",))
            save()
            return r
        stage_mod._PipelineStageBase.perform_reduce_grad = end
        return net
