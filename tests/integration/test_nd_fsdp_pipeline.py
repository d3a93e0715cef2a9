"""FSDP2 stages under torch.distributed.pipelining (strategy=nd, pp2 x dp2, 4 ranks, gpt_nano, fp32,
1F1B over 4 micro-batches) keep each Block gathered after its backward (until the next forward
reshards it) and its gradients whole, unsharded, until the step's end, and reduce-scatter them once
per step, not once per micro-batch: torch's
PipelineStage sets set_reshard_after_backward(False) and set_requires_gradient_sync(False) for
every micro-batch and runs FSDP's post-backward once, in perform_reduce_grad. The planner counts
that (plan/model_states.py, comm.py: nd with pp > 1 and dp > 1). tests/nd_probe.py records it.

Hand count: a gpt_nano Block holds 4 x 64 x 64 + 2 x 64 x 256 + 2 x 2 x 64 = 49,408 parameters:
its full fp32 gradient is 197,632 bytes. Each rank holds one stage: one Block and the root
(stage 0: embeddings; stage 1: final LayerNorm and head), two FSDP groups: 2 reduce-scatters per
step. Stage 0 runs F1 F2 B1 F3 B2 F4 B3 B4: at F3 and F4 its Block is still gathered from the
last backward with the whole gradient accumulated; stage 1 runs F1 B1 F2 B2 ...: F2-F4.
"""
import json

import pytest

from ..conftest import read_record, run_one_job

pytestmark = pytest.mark.integration

BLOCK_GRAD_BYTES = 4 * (4 * 64 * 64 + 2 * 64 * 256 + 2 * 2 * 64)


def test_pipeline_keeps_blocks_gathered_and_reduces_once_per_step(tmp_path_factory, monkeypatch):
    out = tmp_path_factory.mktemp("nd_probe")
    monkeypatch.setenv("ND_PROBE_OUT", str(out))
    job = run_one_job(tmp_path_factory, "nd_probe_job", [
        "strategy=nd", "strategy._target_=tests.nd_probe.ProbedND", "strategy.pp=2", "trainer.devices=4",
        "trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.profile_steps=0"])
    assert read_record(job)["status"] == "completed"
    for rank in range(4):
        events = json.loads((out / f"rank{rank}.json").read_text())
        steps, cur = [], []
        for e in events:
            if e[0] == "step":
                steps.append(cur)
                cur = []
            else:
                cur.append(e)
        assert len(steps) == 3, rank
        for step in steps[1:]:     # (the first step also runs the schedule's shape inference)
            assert sum(e[0] == "reduce" for e in step) == 2, (rank, step)
            fwd = [(e[2], e[3]) for e in step if e[0] == "fwd"]
            kept_from = 2 if rank < 2 else 1          # stage 0 (ranks 0, 1) or stage 1 (2, 3)
            assert fwd == [(False, 0)] * kept_from + [(True, BLOCK_GRAD_BYTES)] * (4 - kept_from), (rank, fwd)
            # each forward reshards the Block again (reshard_after_forward); the gradients stay
            assert [e[2] for e in step if e[0] == "fwd_end"] == [False] * 4, (rank, step)


def test_the_planner_counts_it():
    """nd at pp2 x dp2 (and at pp 1, a one-stage schedule): the stage's whole gradients and one
    Block in use + one prefetched as buffers, the rest of the stage gathered right after a
    backward; the sharded gradients only at the step's end; Blocks gathered m + 1 times a step,
    the root once, one reduce-scatter per group at the step's end."""
    from scalelab.plan import ModelSpec, get_strategy, model_states, resolve_layout
    from scalelab.plan.comm import collectives
    from scalelab.plan.model_states import local_params

    m = ModelSpec.from_shape(4, 256, 8, 256, 128)     # Blocks of 789,760; 4 layers
    st = get_strategy("nd", {"pp": 2, "tp": 1})
    lay = resolve_layout(st, m, 4, micro_batch=2, global_batch=16)    # dp 2, 4 micro-batches
    assert (lay.pp, lay.dp, lay.micro_batches) == (2, 2, 4)
    # the largest stage, by hand: tok_emb 256 x 256 + pos_emb 128 x 256 + 2 Blocks of 789,760
    psi = 65_536 + 32_768 + 2 * 789_760
    assert local_params(m, lay) == psi == 1_677_824
    s = model_states(m, st, lay, "32", "sgd")
    assert s.buffers_bytes == psi * 4 + 2 * 789_760 * 4        # whole fp32 grads + 2 Blocks gathered
    assert s.gathered_after_backward == psi * 4 - 2 * 789_760 * 4
    assert s.grads_at_peak is False
    c = {x.name: x for x in collectives(m, st, lay, "32")}
    assert c["param_all_gather_fwd"].calls == 2 * (4 + 1) and c["param_all_gather_root"].calls == 1
    assert "param_all_gather_bwd" not in c
    assert c["grad_reduce_scatter"].calls == 2 + 1 and not c["grad_reduce_scatter"].overlappable
    one = resolve_layout(get_strategy("nd", {"pp": 1, "tp": 1}), m, 4, micro_batch=1, global_batch=16)
    assert (one.pp, one.dp, one.micro_batches) == (1, 4, 4)
    c1 = {x.name: x for x in collectives(m, get_strategy("nd", {"pp": 1, "tp": 1}), one, "32")}
    assert c1["grad_reduce_scatter"].calls == 4 + 1               # not 5 x 4 micro-batches


def test_the_planner_sizes_a_stage_s_own_blocks_and_root():
    """A 4 x 256 GPT with a 4,096-token vocabulary and an untied head, pp2 x dp2, bf16-mixed: the
    largest stage (stage 0) holds 2 Blocks of 789,760 and the embeddings, 4,096 x 256 + 128 x 256 =
    1,081,344; 2,660,864 in all. Blocks gathered m + 1 = 5 times each in bf16 (2 bytes), the
    embeddings once; one fp32 reduce-scatter (FSDP2's reduce dtype) of the whole stage."""
    from scalelab.plan import ModelSpec, get_strategy, resolve_layout
    from scalelab.plan.comm import collectives

    m = ModelSpec.from_shape(4, 256, 8, 4096, 128, n_params=ModelSpec.gpt_params(4, 256, 4096, 128) + 4096 * 256)
    st = get_strategy("nd", {"pp": 2, "tp": 1})
    lay = resolve_layout(st, m, 4, micro_batch=2, global_batch=16)
    c = {x.name: x for x in collectives(m, st, lay, "bf16-mixed")}
    assert (c["param_all_gather_fwd"].bytes_per_call, c["param_all_gather_fwd"].calls) == (789_760 * 2, 2 * 5)
    assert (c["param_all_gather_root"].bytes_per_call, c["param_all_gather_root"].calls) == (1_081_344 * 2, 1)
    rs = c["grad_reduce_scatter"]
    assert rs.bytes_per_call * rs.calls == pytest.approx(2_660_864 * 4)
    # an untied head: no embedding gradient all-reduce between the end stages (a tied one has it)
    assert "pp_tied_embedding_all_reduce" not in c
    tied = ModelSpec.from_shape(4, 256, 8, 4096, 128)
    assert "pp_tied_embedding_all_reduce" in {x.name for x in collectives(tied, st, lay, "bf16-mixed")}


def test_the_peak_takes_the_moment_right_after_a_backward():
    """With few activations, the peak is right after a backward: the whole stage gathered beside
    one micro-batch fewer of activations (1F1B at pp 2: 2 in flight on stage 0)."""
    from scalelab.plan import ModelSpec
    from scalelab.plan.peak_memory import peak_states_and_activations
    from scalelab.plan.step_time import build_terms

    m = ModelSpec.from_shape(8, 256, 8, 256, 16)    # 4 Blocks of 789,760 a stage, context 16
    t = build_terms(m, "nd", devices=4, pp=2, micro_batch=1, global_batch=8, precision="32", optimizer="sgd")
    st, acts = t.states, t.activations_bytes
    stage0 = 4 * 789_760 + 256 * 256 + 16 * 256                # Blocks + tok_emb + pos_emb
    assert t.layout.micro_batches == 4 and st.gathered_after_backward == stage0 * 4 - 2 * 789_760 * 4
    assert st.gathered_after_backward > acts / 2                 # this shape: the after-backward moment
    want = st.params_bytes + st.optimizer_bytes + (acts - acts / 2 + st.gathered_after_backward)
    assert peak_states_and_activations(t) == pytest.approx(want)


def test_the_planner_counts_hsdp_and_nd_without_fsdp():
    """HSDP (strategy.dp_replicate): FSDP2 shards over dp / dp_replicate ranks and all-reduces each
    reduced shard over the replicas; nd at dp 1 applies no FSDP at all (strategies/nd.py): whole
    fp32 states, Lightning's autocast keeps 16-bit weight copies, nothing gathered."""
    from scalelab.plan import ModelSpec, PlanError, build_terms, get_strategy, resolve_layout

    m = ModelSpec.from_shape(4, 256, 8, 256, 128)
    psi = 1_677_824                                              # the largest stage, by hand (above)
    hsdp = get_strategy("nd", {"pp": 2, "tp": 1, "dp_replicate": 2})
    t = build_terms(m, hsdp, devices=8, micro_batch=1, global_batch=16, precision="32", optimizer="sgd")
    assert (t.layout.dp, t.layout.dp_replicate, t.layout.dp_shard) == (4, 2, 2)
    assert t.states.params_bytes == psi * 4 / 2 and t.states.grads_bytes == psi * 4 / 2
    c = {x.name: x for x in t.colls}
    assert (c["grad_reduce_scatter"].group, c["grad_reduce_scatter"].group_size) == ("dp_shard", 2)
    assert c["grad_reduce_scatter"].calls == 3 and c["grad_reduce_scatter"].bytes_per_call == psi * 4 / 3
    rep = c["grad_all_reduce_replicas"]
    assert (rep.op, rep.group_size, rep.calls, rep.bytes_per_call) == ("all_reduce", 2, 3, psi * 4 / 2 / 3)
    # a shard group of one (dp 2 = 2 replicas): whole stages on every rank
    whole = build_terms(m, hsdp, devices=4, micro_batch=2, global_batch=16, precision="32", optimizer="sgd")
    assert whole.states.params_bytes == psi * 4
    with pytest.raises(PlanError, match="dp_replicate=2 does not divide the data-parallel degree 3"):
        resolve_layout(get_strategy("nd", {"pp": 2, "tp": 1, "dp_replicate": 2}), m, 6, micro_batch=1,
                       global_batch=12)
    plain = build_terms(m, get_strategy("nd", {"pp": 2, "tp": 1}), devices=2, micro_batch=1, global_batch=8,
                        precision="bf16-mixed", optimizer="sgd")
    assert plain.layout.dp == 1 and plain.strategy.family == "fsdp"          # as configured
    # autocast's 16-bit copies of the Linear weights (a share of the stage by the model's mix)
    from scalelab.plan.model_states import autocast_copied_params
    assert plain.states.params_bytes == psi * 4
    assert plain.states.buffers_bytes == 2 * autocast_copied_params(m, psi) and 0 < autocast_copied_params(m, psi) < psi
    assert not [x for x in plain.colls if x.group.startswith("dp")]
