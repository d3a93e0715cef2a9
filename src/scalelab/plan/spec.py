"""Inputs of the planner: the model, the strategy's traits, precision, the parallel layout.

Everything here is plain data plus the checks that turn bad input into one clear line
(`PlanError`, a ValueError) naming the bad value and what would be valid. The strategies'
table and config reading live in strategies.py (re-exported here).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import mesh
from .base import PlanError, conf_dir
from .splits import _divisors, check_sequence_length, check_tp_splits, padded_vocab, pipeline_schedule_refusal, tp_indivisible
from .strategies import STRATEGIES, Strategy, _strategy_config, get_strategy, strategy_names

__all__ = ["PlanError", "conf_dir", "STRATEGIES", "Strategy", "_strategy_config", "get_strategy", "strategy_names",
           "PRECISIONS", "AUTOCAST", "normalize_precision", "compute_dtype", "activation_bytes", "OPTIMIZERS",
           "normalize_optimizer", "CHECKPOINTING", "normalize_checkpointing", "ATTENTION", "ModelSpec", "Layout",
           "resolve_layout", "tp_indivisible", "padded_vocab", "check_tp_splits", "check_sequence_length",
           "pipeline_schedule_refusal", "sdpa_kernel"]


# --------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------
_PRECISION_ALIASES = {
    "32": "32", "32-true": "32", "fp32": "32",
    "bf16-mixed": "bf16-mixed", "bf16": "bf16-mixed",
    "fp16-mixed": "fp16-mixed", "16-mixed": "fp16-mixed", "fp16": "fp16-mixed", "16": "fp16-mixed",
    "bf16-true": "bf16-true", "bf16_true": "bf16-true",
}
# bf16-true: the module itself in bf16 (Lightning casts it): weights, gradients and optimizer
# states 16-bit, no fp32 master copy and no autocast (the trainer takes it for every strategy but
# DeepSpeed's: plan.strategies.trainer_refuses)
PRECISIONS = ("32", "bf16-mixed", "fp16-mixed", "bf16-true")
AUTOCAST = ("bf16-mixed", "fp16-mixed")   # fp32 weights, 16-bit matmuls under torch.autocast


def normalize_precision(p: str) -> str:
    key = str(p).strip().lower()
    if key not in _PRECISION_ALIASES:
        raise PlanError(f"unknown precision {p!r}; valid: {', '.join(PRECISIONS)} "
                        "(aliases: 32-true, bf16, 16-mixed, fp16)")
    return _PRECISION_ALIASES[key]


def compute_dtype(precision: str) -> str:
    """Key into a hardware profile's peak_flops for the matmuls of this precision."""
    return {"32": "fp32", "bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16-true": "bf16"}[precision]


def activation_bytes(precision: str) -> int:
    """Bytes per stored activation element: 16-bit under mixed precision, else 4."""
    return 4 if precision == "32" else 2


OPTIMIZERS = ("adam", "sgd")
#: SGD with momentum 0: torch keeps no state for it. The override form and --validate read it from
#: the run's optim.optimizer.momentum (run_records.optimizer_of_run); as --optimizer, its same job
#: sets the momentum to 0 (cli_job.train_command). Not listed among the flag's values.
SGD_NO_MOMENTUM = "sgd_nomomentum"


def normalize_optimizer(o: str) -> str:
    key = str(o).strip().lower()
    key = {"adamw": "adam", "adam": "adam", "sgd": "sgd"}.get(key, key)
    if key not in OPTIMIZERS + (SGD_NO_MOMENTUM,):
        raise PlanError(f"unknown optimizer {o!r}; valid: adam (also adamw), sgd (with momentum)")
    return key


CHECKPOINTING = ("none", "selective", "full")


def normalize_checkpointing(c) -> str:
    if c is True:
        return "full"
    if c in (False, None):
        return "none"
    key = str(c).strip().lower()
    if key not in CHECKPOINTING:
        raise PlanError(f"unknown activation checkpointing {c!r}; valid: {', '.join(CHECKPOINTING)}")
    return key


ATTENTION = ("flash", "math")


def sdpa_kernel(device: str, dropout: float) -> str:
    """The kernel scalelab's GPT gets from scaled_dot_product_attention: flash / memory-efficient,
    except that torch runs dropout > 0 on CPU with the math kernel (s x s scores and mask stored).
    One rule for a run's record, the flag form and a job planned on another device kind."""
    return "math" if device == "cpu" and dropout > 0 else "flash"


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """A GPT-style decoder (or an MLP: kind="mlp", hidden = width, seq_len = 1).

    n_params is what the model-state formulas use; the shape drives FLOPs, activations and
    per-layer communication. `shape_inferred` marks a shape guessed from --params alone.
    `attention` (flash: O(s) per head, as scalelab's SDPA; math: s x s scores stored) and
    `dropout` only change the activation memory (activations.py).
    """
    n_params: int
    n_layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    ffn_hidden: int = 0          # 0 -> 4 * hidden
    kind: str = "gpt"
    shape_inferred: bool = False
    attention: str = "flash"
    dropout: float = 0.0

    def __post_init__(self):   # frozen: normalise through object.__setattr__
        att = str(self.attention).strip().lower()
        if att not in ATTENTION:
            raise PlanError(f"unknown attention kernel {self.attention!r}; valid: {', '.join(ATTENTION)}")
        try:
            p = float(self.dropout)
        except (TypeError, ValueError):
            p = -1.0
        if not 0.0 <= p < 1.0:     # NaN fails too
            raise PlanError(f"dropout must be a probability in [0, 1), got {self.dropout!r}")
        object.__setattr__(self, "attention", att)
        object.__setattr__(self, "dropout", p)

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def trainer_built(self) -> bool:
        """Whether this is the GPT scalelab-train builds (no biases, an untied head), told by its
        exact count (trainer_gpt_params); else a Megatron-style one (biases, a tied head). The two
        counts coincide only where L (5h + f) = V h (toy vocabularies: 4 x 64 with vocab 36)."""
        return self.kind == "gpt" and self.n_params == self.trainer_gpt_params(
            self.n_layers, self.hidden, self.vocab, self.seq_len, self.ffn_hidden)

    @property
    def layer_params(self) -> int:
        """One transformer block: QKV + out proj (4h^2 + 4h), MLP (2hf + f + h), 2 LayerNorms (4h);
        scalelab-train's has no biases (4h^2 + 2hf + 4h): with them its root (embeddings, final
        LayerNorm, head: n_params less the blocks) came out L (5h + f) short."""
        if self.kind == "mlp":
            return self.hidden * self.hidden + self.hidden
        h, f = self.hidden, self.ffn
        if self.trainer_built:
            return self._trainer_block_params(h, f)
        return 4 * h * h + 2 * h * f + 9 * h + f

    @staticmethod
    def _trainer_block_params(h: int, f: int) -> int:
        """scalelab-train's block: bias-free q, k, v, out and MLP Linears, two LayerNorms."""
        return 4 * h * h + 2 * h * f + 4 * h

    @property
    def untied_head(self) -> bool:
        """Whether n_params has room for an output head of its own beside the token embedding
        (scalelab-train's GPT; a Megatron-style count ties them)."""
        h, f, L = self.hidden, self.ffn, self.n_layers
        return self.kind == "gpt" and (self.n_params - (4 * h * h + 2 * h * f) * L
                                       - (self.vocab + self.seq_len) * h >= self.vocab * h)

    @property
    def embedding_params(self) -> int:
        """Token embedding (tied with the output head) + learned positions."""
        if self.kind == "mlp":
            return max(0, self.n_params - self.n_layers * self.layer_params)
        return self.vocab * self.hidden + self.seq_len * self.hidden

    def weight_matrices(self) -> list[tuple[int, int]]:
        """(elements, count) of the model's weight matrices: q, k, v, out (h^2 each, unfused as in
        scalelab's GPT and HF Llama; Megatron fuses qkv), the two MLP matrices, token and position
        embeddings, and an untied output head when n_params has room for one. The rest of
        n_params (LayerNorms, biases) are vectors. For ZeRO-3's persistence threshold."""
        if self.kind == "mlp":
            return [(self.hidden * self.hidden, self.n_layers)]
        h, f, V, L = self.hidden, self.ffn, self.vocab, self.n_layers
        mats = [(h * h, 4 * L), (h * f, 2 * L), (V * h, 1), (self.seq_len * h, 1)]
        return mats + [(V * h, 1)] if self.untied_head else mats

    def small_params(self, threshold: int) -> int:
        """Parameters in tensors of at most `threshold` elements: vectors (LayerNorms, biases:
        at most L (9h + f) + 2h, layer_params' count) and small matrices."""
        mats = self.weight_matrices()
        vectors = max(0, self.n_params - sum(e * c for e, c in mats))
        if self.kind == "gpt":
            vectors = min(vectors, self.n_layers * (9 * self.hidden + self.ffn) + 2 * self.hidden)
        small = vectors if self.hidden <= threshold else 0   # DeepSpeed: ds_numel <= threshold
        return min(self.n_params, small + sum(e * c for e, c in mats if e <= threshold))

    @property
    def largest_layer_params(self) -> int:
        return max(self.layer_params, self.embedding_params)

    @staticmethod
    def gpt_params(n_layers: int, hidden: int, vocab: int, seq_len: int, ffn_hidden: int = 0) -> int:
        """A Megatron-style GPT: biases, the output head tied to the token embedding (the published
        configurations, recommend/published.py). Not the model scalelab-train builds: trainer_gpt_params."""
        m = ModelSpec(0, n_layers, hidden, 1, vocab, seq_len, ffn_hidden)
        return n_layers * m.layer_params + m.embedding_params + 2 * hidden  # + final LayerNorm

    @staticmethod
    def trainer_gpt_params(n_layers: int, hidden: int, vocab: int, seq_len: int, ffn_hidden: int = 0) -> int:
        """The GPT scalelab-train builds (models/gpt.py, restated here: plan/ imports no torch):
        bias-free q, k, v, out and MLP Linears (4h^2 + 2hf a block), two LayerNorms a block (4h),
        token and learned position embeddings (Vh + sh), the final LayerNorm (2h) and an untied
        lm_head (Vh). tests/unit/test_plan_trainer_model.py counts the real module against it."""
        h, f = int(hidden), int(ffn_hidden or 4 * hidden)
        return int(n_layers) * ModelSpec._trainer_block_params(h, f) + 2 * int(vocab) * h + int(seq_len) * h + 2 * h

    @classmethod
    def trainer_gpt(cls, n_layers, hidden, heads, vocab, seq_len, ffn_hidden=0, attention="flash", dropout=0.0):
        """The shape as scalelab-train builds it (what the flag form of `scalelab plan` and
        `scalelab recommend` plan, so that their `scalelab-train` command is the planned model)."""
        m = cls.from_shape(n_layers, hidden, heads, vocab, seq_len, ffn_hidden, attention=attention,
                           dropout=dropout)          # checks the shape (one PlanError line)
        return replace(m, n_params=cls.trainer_gpt_params(m.n_layers, m.hidden, m.vocab, m.seq_len, m.ffn_hidden))

    @classmethod
    def from_shape(cls, n_layers, hidden, heads, vocab, seq_len, ffn_hidden=0, n_params=None,
                   attention="flash", dropout=0.0):
        for flag, v in (("--layers", n_layers), ("--hidden", hidden), ("--heads", heads),
                        ("--vocab", vocab), ("--seq-len", seq_len)):
            if v is None or int(v) < 1:
                raise PlanError(f"{flag} must be a positive integer, got {v!r}")
        _within_limits(n_params=n_params, layers=n_layers)
        if hidden % heads:
            raise PlanError(f"--heads {heads} does not divide --hidden {hidden}; valid heads: "
                            f"{', '.join(str(d) for d in _divisors(hidden) if d <= 256)}")
        n = n_params or cls.gpt_params(n_layers, hidden, vocab, seq_len, ffn_hidden)
        return cls(int(n), int(n_layers), int(hidden), int(heads), int(vocab), int(seq_len),
                   int(ffn_hidden or 0), attention=attention, dropout=dropout)

    @classmethod
    def from_params(cls, n_params: float, seq_len: int = 2048, vocab: int = 50257):
        """Guess a GPT shape for N parameters: 12 L h^2 ~ N with h ~ 128 L (the aspect ratio of
        GPT-3 175B and LLaMA-7B) beside the embeddings (_guess_hidden); heads of 128; then
        L = (N - embeddings) / (12 h^2)."""
        n, hidden = _guess_hidden(n_params, vocab + seq_len)      # a tied head
        layers = max(1, round((n - (vocab + seq_len) * hidden) / (12 * hidden * hidden)))
        return cls(n, layers, hidden, hidden // 128, vocab, seq_len, shape_inferred=True)

    @classmethod
    def trainer_gpt_for_params(cls, n_params: float, seq_len: int = 2048, vocab: int = 50257):
        """from_params' width for N parameters, the layers that bring scalelab-train's GPT (untied
        head, no biases: trainer_gpt_params) nearest to N, planned at that shape's exact count: the
        model its `scalelab-train` command builds (7B -> 33 x 4096 = 7,064,420,352)."""
        n, hidden = _guess_hidden(n_params, 2 * vocab + seq_len)  # the trainer's untied head
        ends = cls.trainer_gpt_params(0, hidden, vocab, seq_len)   # embeddings, final LayerNorm, head
        per_layer = cls.trainer_gpt_params(1, hidden, vocab, seq_len) - ends
        layers = max(1, round((n - ends) / per_layer))
        exact = cls.trainer_gpt_params(layers, hidden, vocab, seq_len)
        if exact > 1.5 * n:   # below one layer of the narrowest width guessed (128) plus embedding and head
            raise PlanError(f"--params {n:,}: the smallest GPT guessed for it has {exact:,} parameters ({layers} "
                            f"layer x {hidden}, vocab {vocab:,}: embedding and head {ends:,}); give the shape "
                            "(--layers --hidden --heads)" + (" or a smaller --vocab" if ends > n else ""))
        return cls(exact, layers, hidden, hidden // 128, vocab, seq_len, shape_inferred=True)


MAX_PARAMS, MAX_LAYERS = 10**18, 100_000   # a million times today's largest models; far past any


def _within_limits(n_params=None, layers=None) -> None:
    """What the planner models at all: its per-module ZeRO-3 trace and layer-by-layer splits are
    linear in the layers, and a 1e24 --params (2e6 layers) ran for minutes (found by review)."""
    if n_params is not None and float(n_params) > MAX_PARAMS:
        raise PlanError(f"--params {float(n_params):g} is beyond what the planner models (at most {MAX_PARAMS:g})")
    if layers is not None and int(layers) > MAX_LAYERS:
        raise PlanError(f"--layers {layers} is beyond what the planner models (at most {MAX_LAYERS})")


def _guess_hidden(n_params: float, embedding_per_width: int) -> tuple[int, int]:
    """(N, width) for N parameters: the blocks' 12 L h^2 plus the embeddings' (embedding_per_width
    x h) ~ N, with h ~ 128 L. The embeddings count: left out, a 125M model with GPT-2's vocabulary
    was guessed 1024 wide with 2 layers (its embedding and head 103M of the 125M); with them 7 x
    768 with the trainer's untied head, 6 x 1024 with a tied one (GPT-3's is 12 x 768). h a multiple of 1024 from 4096 (heads of 128 split 8 ways for
    tensor parallelism), of 256 below (an even head count)."""
    n = int(float(n_params))
    if n < 1:
        raise PlanError(f"--params must be positive, got {n_params!r}")
    _within_limits(n_params=n)
    lo, hi = 0.0, max(1.0, (128 * n / 12) ** (1 / 3))   # 12 h^3 / 128 + e h rises in h: bisect it
    for _ in range(100):
        h = (lo + hi) / 2
        lo, hi = (lo, h) if 12 * h ** 3 / 128 + embedding_per_width * h > n else (h, hi)
    step = 1024 if h >= 4096 else 256
    return n, max(128, round(h / step) * step)


# --------------------------------------------------------------------------------------------
# Parallel layout
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    world: int
    nodes: int
    devices_per_node: int
    dp: int
    tp: int
    pp: int
    micro_batch: int
    global_batch: int
    micro_batches: int           # per optimizer step per data-parallel replica (accumulation or pipeline m)
    sequence_parallel: bool = field(default=True)
    split: str = "uniform"       # how pipeline stages split the layers (Strategy.pipeline_split)
    stages_per_rank: int = 1     # interleaved 1F1B's virtual stages per pipeline rank
    schedule: str = "none"       # the pipeline schedule (gpipe holds all m micro-batches; also at pp 1);
                                 # none: not a pipeline (gradient accumulation: one at a time)
    dp_replicate: int = 1        # HSDP (nd): replicas of the dp ranks; FSDP2 shards over dp / this

    @property
    def dp_shard(self) -> int:
        return self.dp // self.dp_replicate

    def group_ranks(self, group: str) -> tuple[tuple[int, ...], ...]:
        """Every group of kind `group` (tp, dp, dp_shard, dp_replicate, pp, world) as the mesh
        (pp, [dp_replicate,] dp_shard, tp) lays its ranks out, tp fastest (mesh.py)."""
        return mesh.group_ranks(group, self.pp, self.dp, self.tp, self.dp_replicate)

    def group_nodes(self, group: str) -> int:
        """The most nodes one group of this kind is on (1: each inside a node), from where its
        ranks land (rank r on node r // devices_per_node), not its span: 3 nodes x 8, tp 2, pp 4
        puts the dp group [6, 8, 10] on nodes 0, 1, 1 (found by a planner review)."""
        return mesh.worst_group_nodes(group, self.pp, self.dp, self.tp, self.dp_replicate, self.devices_per_node)

    def group_spans_nodes(self, group: str) -> bool:
        """Some group of this kind crosses a node boundary (the slowest group binds the step)."""
        return self.group_nodes(group) > 1


def resolve_layout(strategy: Strategy, model: ModelSpec, devices: int, nodes: int = 1,
                   tp: int | None = None, pp: int | None = None, micro_batch: int = 1,
                   global_batch: int | None = None, micro_batches: int | None = None) -> Layout:
    """Check the degrees and batch sizes against each other; fill defaults.

    Defaults: the strategy config's tensor_parallel_size, else: tp -> tp = devices per node (TP
    inside a node); fsdp_tp -> tp = devices per node on several nodes, else 2; pipeline -> pp =
    devices (at most the layers), m = 4 pp
    micro-batches; otherwise
    global batch = dp x micro-batch (no accumulation).
    """
    if devices is None or int(devices) < 1:
        raise PlanError(f"--devices must be >= 1 (devices per node), got {devices!r}")
    if nodes is None or int(nodes) < 1:
        raise PlanError(f"--nodes must be >= 1, got {nodes!r}")
    if micro_batch is None or int(micro_batch) < 1:
        raise PlanError(f"--micro-batch must be >= 1, got {micro_batch!r}")
    devices, nodes, micro_batch = int(devices), int(nodes), int(micro_batch)
    world = devices * nodes
    if tp is None:
        tp = 1
        if strategy.tensor_parallel:
            tp = strategy.default_tp or (devices if (not strategy.shard_params or nodes > 1)
                                         else min(2, world))
    if pp is None and strategy.default_pp:   # nd: the strategy config's pp
        pp = strategy.default_pp
    if pp is None:   # pipeline: as many stages as devices allow (a divisor of them, <= layers)
        pp = max(d for d in _divisors(world // tp) if d <= model.n_layers) if strategy.pipeline else 1
    tp, pp = int(tp), int(pp)
    if tp < 1 or pp < 1:
        raise PlanError(f"--tp and --pp must be >= 1, got tp={tp} pp={pp}")
    if tp > 1 and not strategy.tensor_parallel:
        raise PlanError(f"--tp {tp} needs a tensor-parallel strategy; valid: tp, fsdp_tp, nd "
                        f"(got --strategy {strategy.name})")
    if pp > 1 and not strategy.pipeline:
        raise PlanError(f"--pp {pp} needs --strategy pipeline or nd (got --strategy {strategy.name})")
    if tp > 1 and nodes > 1 and devices % tp:
        _refuse_tp_across_nodes(strategy, model, tp, devices, nodes)
    if model.kind == "gpt" and tp > 1:
        check_tp_splits(model, tp, world, strategy.name)
    if pp > model.n_layers:
        raise PlanError(f"--pp {pp} exceeds the number of layers {model.n_layers}; "
                        f"valid pp: 1..{model.n_layers}")
    if world % (tp * pp):
        raise PlanError(f"tp x pp = {tp * pp} does not divide the {world} devices; valid tp x pp: "
                        f"{', '.join(str(d) for d in _divisors(world))}")
    dp = world // (tp * pp)
    replicas = strategy.dp_replicate            # nd rejects one that does not divide dp, also dp 1
    if dp % replicas:
        raise PlanError(f"strategy.dp_replicate={replicas} does not divide the data-parallel degree {dp} "
                        f"(world {world} / tp {tp} / pp {pp}); valid: "
                        f"{', '.join(str(d) for d in _divisors(dp))}")
    per_step = dp * micro_batch
    if global_batch is None:
        m = micro_batches or (4 * pp if strategy.pipeline else 1)
        global_batch = per_step * m
    global_batch = int(global_batch)
    if global_batch < 1:
        raise PlanError(f"--global-batch must be >= 1, got {global_batch}; valid: multiples of dp x micro-batch "
                        f"= {dp} x {micro_batch} = {per_step}")
    if global_batch % per_step:
        raise PlanError(f"--global-batch {global_batch} is not divisible by dp x micro-batch = "
                        f"{dp} x {micro_batch} = {per_step}; valid: multiples of {per_step}")
    if strategy.pipeline:   # pipeline and nd (also at pp 1): the trainer's schedule checks
        m = global_batch // per_step
        why = pipeline_schedule_refusal(strategy.pipeline_schedule, pp, m, strategy.stages_per_rank, model.n_layers)
        if why:
            raise PlanError(f"strategy={strategy.name}: {why} (micro-batch {micro_batch} x {m} micro-batches x dp "
                            f"{dp} = global batch {global_batch}): raise "
                            f"--global-batch, lower --micro-batch, or change --pp")
    return Layout(world, nodes, devices, dp, tp, pp, micro_batch, global_batch,
                  global_batch // per_step, split=strategy.pipeline_split,
                  stages_per_rank=strategy.stages_per_rank if pp > 1 else 1,
                  schedule=strategy.pipeline_schedule if strategy.pipeline else "none",
                  dp_replicate=replicas)


def _refuse_tp_across_nodes(strategy: Strategy, model: ModelSpec, tp: int, devices: int, nodes: int) -> None:
    """scalelab-train keeps a TP group inside a node (config.validate for tp and fsdp_tp, nd's own
    check): a degree that does not divide the devices per node on several nodes is refused there,
    so here too (`--tp 16 --devices 8 --nodes 2` was planned, its same job refused)."""
    valid = [d for d in _divisors(devices) if model.kind != "gpt" or not tp_indivisible(model, d)]
    fix = (f"valid tp: {', '.join(map(str, valid))}" if devices > 1 else
           "with one device per node there is no TP group to make: a data-parallel strategy (ddp, fsdp, zero1-3), "
           "or more --devices per node")
    raise PlanError(f"--tp {tp} does not divide --devices {devices} (devices per node, {nodes} nodes): "
                    f"strategy={strategy.name}: scalelab-train keeps a tensor-parallel group inside a node; {fix}")
