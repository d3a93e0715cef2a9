"""The step's device peak where the gradients are freed right after the optimizer step
(models.lit.LitModule, tests/unit/test_grads_freed.py): the forward runs without them and
backward creates them while it frees the activations, so the peak holds the larger of the two.
Expected totals are hand sums of the parts: fp32 Adam, 1e6 parameters -> params 4e6, grads
4e6, moments 8e6 bytes; the activations from the saved-tensor-checked formula, with the loss's
backward transient at the head (the step peak: tests/unit/test_plan_allocator_peak.py)."""
import pytest

from scalelab.plan import ModelSpec, activation_bytes_per_device
from scalelab.plan.hardware import load_hardware
from scalelab.plan.peak_memory import device_total_bytes
from scalelab.plan.step_time import build_terms, plan_terms

M = ModelSpec(1_000_000, 2, 64, 4, 256, 64)
HW = load_hardware("h200")
RUNTIME = HW.runtime_memory_bytes


def total(strategy, **kw):
    t = build_terms(M, strategy, precision="32", **kw)
    return t, device_total_bytes(t, HW)


def test_single_holds_the_larger_of_gradients_and_activations():
    t, got = total("single", micro_batch=8)               # activations >> 4e6 bytes of gradients
    acts = activation_bytes_per_device(M, t.layout, "32", "none", loss_transient=True)
    assert acts > 4e6 and got == pytest.approx(4e6 + 8e6 + acts + RUNTIME)
    t, got = total("single", micro_batch=1)               # the other way round: the gradients win
    acts = activation_bytes_per_device(M, t.layout, "32", "none", loss_transient=True)
    assert acts < 4e6 and got == pytest.approx(4e6 + 8e6 + 4e6 + RUNTIME)


@pytest.mark.parametrize("strategy,kw", [("ddp", {}),                     # DDP's buckets persist
                                         ("single", {"global_batch": 16}),  # accumulation: 2 micro-batches
                                         ("zero2", {"global_batch": 16}),
                                         ("zero3", {})])                   # its partition buffer persists
def test_gradients_that_live_through_the_forward_add_to_the_activations(strategy, kw):
    t, got = total(strategy, micro_batch=8, **kw)
    st = t.states
    acts = activation_bytes_per_device(M, t.layout, "32", "none", loss_transient=True)
    assert st.grads_at_peak
    # accumulation: the head's fresh gradient beside the accumulated ones (its largest matrix:
    # 64 x 256 elements, fp32), before it is added in
    assert st.new_grad_bytes == (4 * 64 * 256 if strategy == "single" else 0)
    # ... made once the cross entropy's two fp32 logits gradients (8 s b V = 8 x 64 x 8 x 256 bytes,
    # in acts) have given way to one and the saved log-softmax is freed: the larger of the two counts
    head = max(0, st.new_grad_bytes - 8 * 64 * 8 * 256)
    assert head == 0
    assert got == pytest.approx(st.params_bytes + st.grads_bytes + st.optimizer_bytes + acts
                                + head + st.resident_buffer_bytes(False) + RUNTIME)


def test_zero2_frees_its_gradient_partition_and_buckets_in_the_step():
    # DeepSpeed ZeRO-1/2 allocate grads_in_partition and the reduce buckets in backward and free
    # them in the step. H200 (runs 2): zero2 device memory plan/meas 1.026 (86M) and 1.067 (1.2B)
    # with the sum; 1.001 and 1.004 now (the 1.2B one with zero_grads_allocated_early).
    t, got = total("zero2", micro_batch=8)
    st = t.states
    acts = activation_bytes_per_device(M, t.layout, "32", "none", loss_transient=True)
    assert not st.grads_at_peak and st.grads_bytes > 0 and acts > st.grads_bytes
    assert got == pytest.approx(st.params_bytes + st.optimizer_bytes + acts + st.resident_buffer_bytes(False)
                                + RUNTIME)


def test_the_plan_says_which_rule_it_used():
    doc = plan_terms(build_terms(M, "fsdp", micro_batch=8, precision="32"), HW)
    assert doc["memory"]["gradients_at_peak"] is False
    assert plan_terms(build_terms(M, "ddp", micro_batch=8, precision="32"), HW)["memory"]["gradients_at_peak"]


def test_a_ddp_config_under_another_name_keeps_its_buckets():
    from scalelab.plan import get_strategy

    st = get_strategy("my_ddp", {"_target_": "scalelab.strategies.ddp.DDP"})
    assert st.grad_buckets and not get_strategy("fsdp").grad_buckets
    t = build_terms(M, st, micro_batch=8, precision="32")
    assert t.states.grads_at_peak


def test_records_measured_with_lightning_s_order_are_read_with_the_sum():
    from scalelab.plan.run_records import terms_from_run

    run = {"strategy": "single", "world_size": 1, "per_device_batch_size": 8, "precision": "32",
           "optimizer": "adam", "model": {"n_params": 1_000_000, "n_layers": 2, "hidden": 64, "heads": 4,
                                          "vocab": 256, "seq_len": 64}}
    assert not terms_from_run(run).states.grads_at_peak                       # a plan: no measurement
    assert not terms_from_run({**run, "memory": {"grads_freed_after_step": True}}).states.grads_at_peak
    assert terms_from_run({**run, "memory": {"peak_rss_bytes_per_rank": [1]}}).states.grads_at_peak  # older
    # DeepSpeed's engine always freed ZeRO-2's gradients in its step: older records keep the new rule
    zero2 = {**run, "strategy": "zero2", "memory": {"peak_rss_bytes_per_rank": [1]}}
    assert not terms_from_run(zero2).states.grads_at_peak


def test_zero2_with_buckets_smaller_than_the_model_allocates_its_partition_early():
    # B = 1e5 of Psi = 1e6 elements; the largest tensor of this spec (its MLP matrix: 64 x 256 =
    # 16,384 elements) -> the partition arrives beside 1 - (1e5 - 16,384) / 1e6 = 0.916 of the
    # activations (ds_buffers_probe.py counts when real engines allocate it)
    from scalelab.plan import get_strategy

    st = get_strategy("zero2", {"reduce_bucket_size": 100_000})
    t = build_terms(M, st, micro_batch=8, precision="32")
    s = t.states
    assert s.acts_alive_at_grads == pytest.approx(1 - (100_000 - 16_384) / 1e6)
    acts = activation_bytes_per_device(M, t.layout, "32", "none", loss_transient=True)
    assert device_total_bytes(t, HW) == pytest.approx(s.params_bytes + s.optimizer_bytes + s.grads_bytes + 0.916384 * acts
                                                      + s.resident_buffer_bytes(False) + RUNTIME)


def test_full_recompute_keeps_an_early_zero2_partition_whole():
    # An early partition under full recompute (a 24 x 2048 GPT, 2 ranks, B = 5e8 of its 1.2e9
    # elements): late in backward the whole partition (grads_bytes) is there beside every block's
    # stored input, the token ids (8 s b) and one recomputed block (the saved-tensor-checked
    # formula); counted as growing block by block, as where backward makes the gradients, the
    # peak came out 1.9 GB short of that floor (now 0.6 GB over it: the MLP transient, a block's fresh gradients)
    from scalelab.plan import get_strategy
    from scalelab.plan.activations import gpt_layer_activation_bytes

    big = ModelSpec.from_shape(24, 2048, 16, 256, 2048)
    t = build_terms(big, get_strategy("zero2"), devices=2, micro_batch=8, global_batch=16, precision="32",
                    activation_checkpointing="full")
    s = t.states
    assert s.acts_alive_at_grads > 0 and not s.grads_at_peak
    kw = dict(e=4, ffn=4 * 2048)
    stored = gpt_layer_activation_bytes(2048, 8, 2048, 16, checkpointing="full", **kw)
    assert stored == 4 * 2048 * 8 * 2048                                  # the fp32 residual stream
    block = gpt_layer_activation_bytes(2048, 8, 2048, 16, checkpointing="none", **kw)
    floor = (s.params_bytes + s.optimizer_bytes + s.grads_bytes + 24 * stored + 8 * 2048 * 8 + block
             + s.resident_buffer_bytes(False) + RUNTIME)
    assert floor <= device_total_bytes(t, HW) <= floor * 1.05
