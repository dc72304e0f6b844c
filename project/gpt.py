"""A GPT as nanoGPT writes it: token and position embeddings, pre-LayerNorm blocks of causal self-attention and an
MLP, a final LayerNorm and a head tied to the token embedding. Attention is torch's
``scaled_dot_product_attention`` with ``is_causal=True``, so a GPU runs its flash or memory-efficient kernel.

Takes ``input_shape`` = (block_size,), the longest context, and ``num_outputs`` = the vocabulary size (both linked
from the DataModule); maps token ids (batch, T <= block_size) to next-token logits (batch, T, vocabulary)."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from project.engine import ConfigError


class SelfAttention(nn.Module):
    """Causal (each position attends to itself and the earlier ones), or over the positions ``keep`` allows."""

    def __init__(self, width: int, heads: int, dropout: float, causal: bool = True) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        # Modules, not numbers, so the engine's tests (and you) can switch dropout off by module; the attention
        # weights' dropout reads its p from attention_dropout.
        self.attention_dropout = nn.Dropout(dropout)
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, dim=2))
        p = self.attention_dropout.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p, is_causal=self.causal)
        return self.residual_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, width)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, causal: bool = True) -> None:
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(width), SelfAttention(width, heads, dropout, causal)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: Tensor, keep: Tensor | None = None) -> Tensor:
        x = x + self.attention(self.norm1(x), keep)
        return x + self.mlp(self.norm2(x))


def check_sizes(input_shape: tuple[int, ...], layers: int, heads: int, width: int, dropout: float) -> None:
    if len(input_shape) != 1:
        raise ConfigError(f"a transformer needs token sequences shaped (length,), got input_shape={input_shape}.")
    if layers < 1 or heads < 1 or width % heads:
        raise ConfigError(
            f"model.net.init_args: layers={layers}, heads={heads}, width={width}: layers and heads must be >= 1 and "
            "the width a multiple of the heads."
        )
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"model.net.init_args.dropout={dropout!r}: dropout must lie in [0, 1).")


def init_weights(module: nn.Module, layers: int) -> None:
    """GPT-2's initialisation: N(0, 0.02), the residual projections scaled down by the depth, biases 0."""
    for name, p in module.named_parameters():
        if p.ndim >= 2:
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
            nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)


class GPT(nn.Module):
    """``layers`` blocks of ``heads`` heads, ``width`` wide."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_outputs: int,
        layers: int = 4,
        heads: int = 4,
        width: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_sizes(input_shape, layers, heads, width, dropout)
        self.block_size = input_shape[0]
        self.tokens = nn.Embedding(num_outputs, width)
        self.positions = nn.Embedding(self.block_size, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_outputs, bias=False)
        self.head.weight = self.tokens.weight  # tied: one matrix maps ids to vectors and vectors to logits
        init_weights(self, layers)

    def shard_units(self) -> list[nn.Module]:
        """FSDP's units (configs/fsdp.yaml): the blocks; the embeddings, the final norm and the head tied to the token
        embedding are the net's own (one weight, one unit)."""
        return list(self.blocks)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.dropout(self.tokens(ids) + self.positions(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
