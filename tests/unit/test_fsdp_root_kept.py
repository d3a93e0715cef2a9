"""FSDP2's root (embeddings, final LayerNorm, head) stays gathered from the forward to the backward
(strategies/fsdp.py apply_fsdp: torch's default for the root), while each Block is resharded after
its forward under FULL_SHARD. Counted on a real run (world size 1: FSDP2 still unshards each group
into its own buffers): unshards per steady step, and which groups are gathered at the end of the
forward. gpt_nano has 2 Blocks: 3 groups. Before: 6 unshards per step (every group twice),
the root resharded at the end of the forward. fsdp_grad_op keeps every group: 3."""
import lightning as L
import pytest

from ..host_syncs import run_job, write_job


class Groups(L.Callback):
    def __init__(self):
        self.unsharded_at_forward_end: list[list[bool]] = []

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

        groups = []
        for m in pl_module.modules():
            state = _get_module_fsdp_state(m)
            if state is not None and state._fsdp_param_group is not None and m is state._modules[0]:
                groups.append((state._fsdp_param_group._module_fqn, state._fsdp_param_group.is_unsharded))
        self.unsharded_at_forward_end.append(groups)


@pytest.mark.parametrize("strategy, unshards", [("fsdp", 5), ("fsdp_grad_op", 3)])
def test_root_is_gathered_once_per_step(tmp_path, monkeypatch, strategy, unshards):
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    calls: list[int] = []
    real = FSDPParamGroup.wait_for_unshard

    def counted(self, *a, **k):
        # a group's gather completes here (copy-out of the all-gather); one already gathered is not
        # gathered again (unshard may be called twice for one gather: prefetch, then its own hook)
        if not self.is_unsharded:
            calls.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(FSDPParamGroup, "wait_for_unshard", counted)
    seen, per_step = Groups(), []

    class Steps(L.Callback):
        def on_train_batch_end(self, *a):
            per_step.append(len(calls))

    job = write_job(tmp_path / "job", [f"strategy={strategy}", "model=gpt_nano", "logger=none",
                                       "trainer.accelerator=cpu", "trainer.max_steps=4", "trainer.warmup_steps=1",
                                       "trainer.profile_steps=0", "data.global_batch_size=4"])
    record = run_job(job, extra_callbacks=[seen, Steps()])
    assert record["status"] == "completed"
    assert [b - a for a, b in zip(per_step, per_step[1:])] == [unshards] * 3
    names = [[n for n, _ in step] for step in seen.unsharded_at_forward_end]
    assert names[-1] == ["", "layers.0", "layers.1"]      # the root, then the Blocks' groups
    # at the end of the forward: the root gathered; the Blocks too only without resharding
    assert [u for _, u in seen.unsharded_at_forward_end[-1]] == [True] + [strategy == "fsdp_grad_op"] * 2
