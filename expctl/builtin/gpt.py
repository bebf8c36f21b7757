"""``model=gpt``: a decoder-only transformer (GPT-2's layout, as nanoGPT writes it), with rotary
or learned positions and the output layer tied to the token embedding.

Built on the meta device and initialised afterwards, as torchtitan does: `GPT.__init__` makes its
layers on the meta device (no memory, no random draw), then, unless the caller is building on the
meta device itself, moves them to the default device and calls `init_weights()`. So for a seed,
``GPT(...)``, the factory ``gpt(...)`` and ``with torch.device("meta"): m = GPT(...)`` followed by
``m.to_empty(device=d); m.init_weights()`` give the same weights. The blocks are ``model.blocks``
(an ``nn.ModuleList``): what a sharding strategy wraps one by one.

The arguments are checked without torch in `expctl.builtin.checks.gpt`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from expctl.builtin import checks
from expctl.registry import register

INIT_STD = 0.02  # GPT-2's
ROPE_BASE = 10000.0


def _rotary(length: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's rotation angles, (length, head_dim / 2). Made in each
    forward (a few hundred values): buffers would be broadcast by DDP at every step."""
    inv = ROPE_BASE ** -(
        torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary positions on (batch, heads, time, head_dim): the two halves of each head are the
    pairs rotated (GPT-NeoX's layout), in float32."""
    cos, sin = rope
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).type_as(x)


class Attention(nn.Module):
    """Causal multi-head self-attention (`F.scaled_dot_product_attention`: flash or memory-
    efficient kernels where the device has them)."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
            for z in self.qkv(x).split(c, dim=2)
        )
        if rope is not None:
            q, k = _rotate(q, rope), _rotate(k, rope)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """One transformer block: pre-LayerNorm attention and MLP (4 x wide, GELU), each residual."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, bias=False)
        self.attn = Attention(d_model, n_head, dropout)
        self.norm2 = nn.LayerNorm(d_model, bias=False)
        self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.proj = nn.Linear(4 * d_model, d_model, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.drop(self.proj(F.gelu(self.fc(self.norm2(x)))))

    @torch.no_grad()
    def init_weights(self, std: float, residual_std: float) -> None:
        """N(0, std) weights; the projections into the residual stream get `residual_std`."""
        for norm in (self.norm1, self.norm2):
            nn.init.ones_(norm.weight)
        for linear, s in (
            (self.attn.qkv, std),
            (self.attn.proj, residual_std),
            (self.fc, std),
            (self.proj, residual_std),
        ):
            nn.init.normal_(linear.weight, mean=0.0, std=s)


class GPT(nn.Module):
    """Decoder-only transformer: token ids (batch, time) -> next-token logits (batch, time,
    vocab_size). See the module docstring for how it is built and initialised."""

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        d_model: int,
        pos: str = "rotary",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        checks.gpt(
            vocab_size=vocab_size,
            block_size=block_size,
            n_layer=n_layer,
            n_head=n_head,
            d_model=d_model,
            pos=pos,
            dropout=dropout,
        )
        self.vocab_size, self.block_size, self.pos = vocab_size, block_size, pos
        self.n_layer, self.n_head, self.d_model = n_layer, n_head, d_model
        target = torch.get_default_device()
        with torch.device("meta"):  # nothing drawn here: init_weights draws every value
            self.tok_emb = nn.Embedding(vocab_size, d_model)
            self.pos_emb = nn.Embedding(block_size, d_model) if pos == "learned" else None
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
            self.norm = nn.LayerNorm(d_model, bias=False)
        positions = self.pos_emb.weight.numel() if self.pos_emb is not None else 0
        self.num_params = sum(p.numel() for p in self.parameters()) - positions
        if target.type != "meta":
            self.to_empty(device=target)
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's initialisation, in a fixed order (the same values wherever the parameters
        live): N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 n_layer)), LayerNorm
        weights 1. Call it after `to_empty` when the model was built on the meta device."""
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=INIT_STD)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, mean=0.0, std=INIT_STD)
        residual = INIT_STD / math.sqrt(2 * self.n_layer)
        for block in self.blocks:
            block.init_weights(INIT_STD, residual)  # type: ignore[operator]
        nn.init.ones_(self.norm.weight)

    def flops_per_token(self) -> int:
        """Training FLOPs per token, forward and backward: 6 N + 12 n_layer d_model block_size
        (PaLM's appendix B, nanoGPT's `estimate_mfu`), N the parameters but the position
        embedding (the tied token embedding counts once: it is the output layer's matmul)."""
        return 6 * self.num_params + 12 * self.n_layer * self.d_model * self.block_size

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(f"a sequence of {t} tokens; the model takes at most {self.block_size}")
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(t, device=idx.device))
        x = self.drop(x)
        rope = _rotary(t, self.d_model // self.n_head, idx.device) if self.pos == "rotary" else None
        for block in self.blocks:
            x = block(x, rope)
        return F.linear(self.norm(x), self.tok_emb.weight)  # tied: no weight of its own


@register("models", inferred=("vocab_size", "block_size"), check=checks.gpt)
def gpt(
    vocab_size: int = 50304,
    block_size: int = 1024,
    n_layer: int = 12,
    n_head: int = 12,
    d_model: int = 768,
    pos: str = "rotary",
    dropout: float = 0.0,
) -> GPT:
    """Decoder-only transformer (GPT-2 small's sizes; pos: rotary | learned; tied embeddings)."""
    return GPT(vocab_size, block_size, n_layer, n_head, d_model, pos, dropout)
