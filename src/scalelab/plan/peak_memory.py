"""A step's memory peak: model states and activations at the step's peak moment (the CPU
allocator's: tests/unit/test_plan_allocator_peak.py; saved tensors: test_plan_saved_tensors.py),
one device's total with buffers and runtime, and the host RAM one node's ranks need. Apart from
step_time.py (time) so each stays short; both read the same Terms (step_time.build_terms)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import activations as act_mod
from .hardware import Hardware
from .model_states import pipeline_acts_alive_at_grads, tied

if TYPE_CHECKING:
    from .step_time import Terms


def peak_states_and_activations(terms: Terms) -> float:
    """Model states + activations at the step's peak. Gradients freed before the forward
    (model_states.grads_at_peak) appear in backward as the activations are freed: the peak is the
    larger of the activations and the gradients plus what activations are still alive when the
    whole gradient is allocated (none where it grows layer by layer), not their sum."""
    st = terms.states
    acts = terms.activations_bytes
    full = any(terms.recompute_per_rank)
    # full recompute under autocast: the blocks' weight copies are gone after the forward (its
    # autocast's exit), by the head's backward (when the gradient is whole every copy is: copies_bytes)
    gone = st.copies_gone_at_head if full else 0.0
    if st.gathered_after_backward:
        # FSDP2 under a pipeline schedule: right after a backward the stage (interleaved: that
        # chunk) is gathered and one micro-batch (chunk) of activations fewer is alive, on each rank
        acts = max(acts, *(a - a / act_mod.stage_in_flight(terms.layout, r) + st.gathered_after_backward
                           for r, a in enumerate(terms.activations_per_rank or (acts,))))
    if st.grads_per_rank and st.grads_at_peak:
        # each pipeline rank by its own schedule at dp 1 (the largest stage's gradients on every
        # rank); at dp > 1 its DDP keeps them from the step's start (bucket views): at every peak.
        # FSDP2 stages at dp > 1 set their sharded gradients at the step's end: not at the peak
        # (receive buffers stay whole when backward frees micro-batches)
        grads_acts = max(pipeline_grads_and_acts(st.grads_bytes, a, buf, pipeline_acts_alive_at_grads(terms.layout, r))
                         for r, (a, buf) in enumerate(zip(terms.activations_per_rank, terms.receive_per_rank)))
    elif st.grads_at_peak:
        # gradients alive through the forward (accumulation, DDP's buckets, ZeRO-3's partition):
        # backward makes each new gradient beside the accumulated one before adding it in; the
        # head's (the largest tensor) at once, beside every activation (the CPU allocator:
        # tests/unit/test_plan_allocator_peak.py)
        grads_acts = st.grads_bytes + _head_moment(terms, acts, gone, st.new_grad_bytes)
    else:
        # (the weight copies are all freed by then: each with its layer's backward)
        grads_acts = max(_head_moment(terms, acts, gone), st.grads_bytes + st.acts_alive_at_grads * acts - st.copies_bytes)
    if full:
        grads_acts = max(grads_acts, _late_moment(terms))
    return st.params_bytes + st.optimizer_bytes + grads_acts


def _late_moment(terms: Terms) -> float:
    """Full recompute's backward: a recomputed block beside the gradients made so far, without
    the autocast weight copies (in buffers) dropped after the forward. Without a pipeline, block
    k's backward holds the gradients of the head and of the blocks above it, the stored inputs of
    blocks 0..k and its own backward (activations.recompute_backward_bytes), so the peak is at
    block 0 when a block's gradients outweigh its stored input, else at block L-1; the
    embeddings' gradients come after block 0, the block's own down projection's first. A
    pipeline schedule (also at pp 1): every gradient and every stored input
    (recompute_peak_per_rank), its in-flight micro-batches keeping theirs."""
    st, m, layout = terms.states, terms.model, terms.layout
    if layout.schedule != "none" or m.kind != "gpt":
        return st.grads_bytes + max(terms.recompute_per_rank) - st.copies_gone_in_backward
    own, stored = act_mod.recompute_backward_bytes(m, layout, terms.precision,
                                                   weights_16bit=terms.weights_16bit)
    per = st.grads_bytes / m.n_params                     # gradient bytes per model parameter here
    h, L = m.hidden, m.n_layers
    head = (0 if tied(m) else m.vocab * h) + 2 * h         # the head and the final LayerNorm
    # a block's share of n_params (its real count: layer_params is the shape's, with biases)
    g_block = max(0.0, m.n_params - head - m.embedding_params) / L * per
    g_down = (h * m.ffn + h) * per                        # the down projection's, made first
    if st.grads_at_peak or st.acts_alive_at_grads:
        # the whole gradient is there through backward (accumulated, or a ZeRO-1/2 partition
        # allocated early): the peak is at block L-1, with every stored input
        return st.grads_bytes + g_down + own + (L - 1) * stored - st.copies_gone_in_backward
    # made before block L-1: the head's and the final LayerNorm's (a tied head's into the token
    # embedding's); after block 0: the embeddings' (but a tied head's)
    g_head = (m.vocab * h + 2 * h) * per
    return g_head + g_down + own + (L - 1) * max(g_block, stored) - st.copies_gone_in_backward


def _head_moment(terms: Terms, acts: float, gone: float, new_grad: float = 0.0) -> float:
    """The activations' moment (with a fresh head gradient beside accumulated ones, new_grad)
    less the autocast copies `gone` by then (buffers count them all). Full recompute under
    autocast: the cast cache holds every copy to the forward's end, without the cross entropy's
    backward transient yet; at that transient only the head's copy is left (the CPU allocator:
    tests/unit/test_plan_allocator_peak.py). Otherwise (gone 0) every copy is saved for backward."""
    # the head's new gradient is made after the cross entropy's backward transient (two logits
    # gradients) has given way to one logits gradient, and the saved log-softmax is freed: the
    # moment holds the larger of the two (fp32 on the CPU allocator: 0.998, was 1.05)
    new_grad = max(0.0, new_grad - terms.loss_transient_bytes)
    if not gone:
        return acts + new_grad
    return max(acts - terms.loss_transient_bytes, acts + new_grad - gone)


def pipeline_grads_and_acts(grads: float, acts: float, resident: float, alive: float | None) -> float:
    """A pipeline rank's peak of gradients and activations: both (alive None), or the larger of
    its activations and its gradients beside the `alive` fraction of the rest of them plus its
    resident receive buffers (model_states.pipeline_acts_alive_at_grads)."""
    if alive is None:
        return grads + acts
    return max(acts, grads + alive * (acts - resident) + resident)


def device_total_bytes(terms: Terms, hw: Hardware) -> float:
    """The step's peak on one device: states and activations, buffers, runtime."""
    return (peak_states_and_activations(terms) + terms.states.resident_buffer_bytes(hw.kind == "cpu")
            + hw.runtime_memory_bytes)


def host_node_bytes(terms: Terms, hw: Hardware) -> float | None:
    """Host RAM one node's ranks need on a GPU profile: each rank's offloaded model states
    (ZeRO-Offload) and pinned staging buffers, plus its process (hw.host.runtime_bytes_per_rank:
    interpreter, torch, Lightning, DeepSpeed; a rank's peak RSS measured on the H200), times the
    ranks on the node. None on CPU profiles (a CPU rank's states are in its device memory, counted there)."""
    if hw.kind == "cpu":
        return None
    st = terms.states
    per_rank = st.offloaded_bytes + st.host_buffer_bytes + float(hw.host.get("runtime_bytes_per_rank") or 0.0)
    return per_rank * terms.layout.devices_per_node


def fits_host(terms: Terms, hw: Hardware) -> bool:
    """The node's host RAM holds what its ranks keep there (True where the profile gives no host
    memory_bytes)."""
    need, have = host_node_bytes(terms, hw), hw.host.get("memory_bytes")
    return need is None or not have or need <= float(have)


#: the fraction of device memory `scalelab recommend` keeps free (its --memory-headroom default):
#: the allocator's slack and fragmentation, beyond the planner's count; plan calls a fit above it tight
HEADROOM = 0.1


def tight(total_bytes: float, memory_bytes: float) -> bool:
    """More than 1 - HEADROOM of memory_bytes taken (for a fit: one recommend prunes); False where
    the memory is not known (0)."""
    return bool(memory_bytes) and total_bytes > (1 - HEADROOM) * memory_bytes


def fits(terms: Terms, hw: Hardware) -> bool:
    return device_total_bytes(terms, hw) <= hw.memory_bytes and fits_host(terms, hw)
