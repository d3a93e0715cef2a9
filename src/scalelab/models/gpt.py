"""A GPT-style decoder as a plain nn.Module (nanoGPT shape). It knows nothing of ranks:
strategies in scalelab.strategies parallelize it from the outside.

q, k and v are separate Linears (not one fused qkv) so tensor parallelism can split each
column-wise by heads without re-ordering a fused weight.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    seq_len: int = 64
    vocab_size: int = 256  # byte-level tokens
    mlp_ratio: int = 4
    dropout: float = 0.0
    # none | selective (recompute the attention core: SDPA) | full (recompute each block; keep
    # only its input). Booleans from older configs map to full / none.
    activation_checkpointing: str = "none"

    def __post_init__(self) -> None:
        ac = self.activation_checkpointing
        ac = {True: "full", False: "none", None: "none"}.get(ac, ac) if isinstance(ac, (bool, type(None))) else ac
        if ac not in CHECKPOINTING:
            raise ValueError(f"activation_checkpointing={self.activation_checkpointing!r} is not valid: choose one "
                             f"of {', '.join(CHECKPOINTING)} (true = full, false = none)")
        self.activation_checkpointing = ac


CHECKPOINTING = ("none", "selective", "full")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d = cfg.d_model
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.out_proj = nn.Linear(d, d, bias=False)
        self.head_dim = d // cfg.n_heads
        self.dropout = cfg.dropout
        self.recompute = cfg.activation_checkpointing == "selective"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds only its share of the heads.
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        p = self.dropout if self.training else 0.0
        if self.recompute and self.training:  # selective: backward re-runs the kernel (RNG state kept)
            y = checkpoint(F.scaled_dot_product_attention, q, k, v, is_causal=True, dropout_p=p,
                           use_reentrant=False)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model={cfg.d_model} must be divisible by n_heads={cfg.n_heads}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        # A ModuleDict keyed "0".."L-1" keeps names stable when pipeline stages drop layers.
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_seed = torch.initial_seed()  # the run's seed (seed_everything) at construction
        if not any(p.is_meta for p in self.parameters()):  # on the meta device: filled by the strategy
            with torch.no_grad():
                for name, p in self.named_parameters():
                    self.fill_initial(name, p)

    def fill_initial(self, name: str, t: torch.Tensor) -> None:
        """Write parameter `name`'s initial value into `t` (the parameter's full shape, on any
        device). Each parameter draws from its own generator seeded by (init_seed, name), so its
        value does not depend on which other parameters a rank builds or in what order: a
        strategy that builds the model on the meta device and materializes only its shards
        (strategies/materialize.py) gets the same weights as `single`, parameter by parameter.
        GPT-2 init: N(0, 0.02) for Linear and Embedding weights, N(0, 0.02/sqrt(2L)) for the
        residual projections (out_proj, down), LayerNorm weight 1 and bias 0."""
        owner = self.get_submodule(name.rpartition(".")[0])
        if isinstance(owner, nn.LayerNorm):
            t.fill_(1.0) if name.endswith("weight") else t.zero_()
            return
        std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("out_proj.weight", "down.weight")) else 0.02
        g = torch.Generator(device=t.device)
        g.manual_seed((int(self.init_seed) * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
        t.normal_(0.0, std, generator=g)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab). Stages of a pipeline may lack
        tok_emb / lm_head (set to None); then they pass hidden states through."""
        x = idx
        if self.tok_emb is not None:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.layers.values():
            if self.cfg.activation_checkpointing == "full" and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.lm_head is not None:
            x = self.lm_head(self.ln_f(x))
        return x

    def flops_per_token(self) -> int:
        return flops_per_token(self.cfg)


def non_embedding_params(cfg: GPTConfig) -> int:
    """Parameters outside the token and position embeddings, from the config alone: per block
    q, k, v, out (4 d^2, no bias) + MLP up/down (2 r d^2) + two LayerNorms (4 d); then the final
    LayerNorm (2 d) and the untied LM head (V d). Counted from the config, never from live
    tensors: ZeRO-3 partitions them, a pipeline stage holds a few layers, TP a shard."""
    d, r = cfg.d_model, cfg.mlp_ratio
    return cfg.n_layers * (4 * d * d + 2 * r * d * d + 4 * d) + 2 * d + cfg.vocab_size * d


def flops_per_token(cfg: GPTConfig) -> int:
    """Training FLOPs per token, 6N + 12*L*T*d (Kaplan et al. 2020 / PaLM appendix B):
    6 per non-embedding parameter (fwd 2 + bwd 4) for the matmuls, plus attention scores and
    values. The same for every strategy of one model: a model property, not a rank's."""
    return 6 * non_embedding_params(cfg) + 12 * cfg.n_layers * cfg.seq_len * cfg.d_model


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
