"""Fusing a decoder's matrices that read the same input (after gpt-fast's fused ``wqkv``)."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import Attention
from ..model import MLP, Decoder
from ..quant.linear import Int4Linear, Int8Linear

__all__ = ["concat_linears", "FusedAttention", "FusedMLP", "fuse", "is_fused"]


def concat_linears(layers: list[nn.Module]) -> nn.Module:
    """One layer computing what ``layers`` compute, their outputs side by side on the last
    dimension. All must take the same input and be of one kind: ``nn.Linear`` without a bias,
    :class:`~kvlib.quant.Int8Linear` or :class:`~kvlib.quant.Int4Linear`."""
    kinds = {type(layer) for layer in layers}
    if len(kinds) != 1:
        raise TypeError(f"concat_linears: the layers must be of one kind, got {sorted(k.__name__ for k in kinds)}")
    kind = kinds.pop()
    if kind in (Int8Linear, Int4Linear):
        return kind.concat(layers)
    if kind is not nn.Linear or any(layer.bias is not None for layer in layers):
        raise TypeError(f"concat_linears takes nn.Linear (no bias), Int8Linear or Int4Linear layers, got {kind.__name__}")
    weight = torch.cat([layer.weight.detach() for layer in layers])                 # (sum of outs, in)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    return fused


class FusedAttention(Attention):
    """:class:`kvlib.attention.Attention` with ``wq``, ``wk`` and ``wv`` stacked into one ``wqkv``: the
    rest of the layer (rotation, cache, attention, ``wo``) is the parent's own code."""

    def __init__(self, attn: Attention) -> None:
        nn.Module.__init__(self)
        self.n_heads, self.n_kv_heads, self.head_dim = attn.n_heads, attn.n_kv_heads, attn.head_dim
        self.widths = [attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim]
        self.wqkv = concat_linears([attn.wq, attn.wk, attn.wv])
        self.wo = attn.wo

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.wqkv(x).split(self.widths, dim=-1)     # (batch, seq, q width), then the k and v widths
        return q, k, v


class FusedMLP(MLP):
    """SwiGLU with ``gate`` and ``up`` stacked into one ``gate_up``: ``down(silu(g) * u)``."""

    def __init__(self, mlp: MLP) -> None:
        nn.Module.__init__(self)
        self.gate_up = concat_linears([mlp.gate, mlp.up])
        self.down = mlp.down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)            # (batch, seq, d_mlp) each
        return self.down(F.silu(gate) * up)


def is_fused(model: nn.Module) -> bool:
    """Whether ``model``'s layers are already fused by :func:`fuse`."""
    return any(isinstance(m, (FusedAttention, FusedMLP)) for m in model.modules())


@torch.no_grad()
def fuse(model: Decoder, *, int8_output_layer: bool = False) -> Decoder:
    """A copy of ``model`` whose attention and MLP layers are fused (:class:`FusedAttention`,
    :class:`FusedMLP`); ``model`` itself is left as it was.

    ``int8_output_layer=True`` also stores the output layer (the embedding, transposed) as a
    per-row int8 layer, which reads a quarter of float32's bytes per token (its effect on the
    predictions is measured by the bench, beside its speed).
    """
    if not isinstance(model, Decoder):
        raise TypeError(f"fuse takes a kvlib.Decoder, got {type(model).__name__}")
    if is_fused(model):
        raise ValueError("this model is already fused: fuse the model it came from")
    out = copy.deepcopy(model)
    for block in out.blocks:
        block.attn = FusedAttention(block.attn)
        block.mlp = FusedMLP(block.mlp)
    if int8_output_layer:
        if out.lm_head is not None:
            raise ValueError("this model already has an output layer of its own; int8_output_layer replaces "
                             "only the tied embedding")
        out.lm_head = Int8Linear.from_weight(model.embed.weight.float())
    return out.eval()
