"""Another rounding of weights that are already quantized: what a grid costs, measured on a model
whose weights lie on some other grid.

The real model's float32 weights are its file's Q4_1 blocks, decoded. Quantizing them again
with the file's own grid (Q4_1, blocks of 32 aligned with the file's) gives them back almost
exactly, so it says nothing about what 4 bits cost. Rounding them to *another* grid does: the
blocks shifted so that they no longer line up with the file's, Q4_0's symmetric blocks, int4
in larger groups, 3 bits. :func:`requantize` builds a copy of a model whose linear layers hold
their weights rounded to a named grid and back (float32, computed as the original is), so that
:func:`kvlib.measure.quality.evaluate_many` measures the rounding alone.

The llama.cpp grids use the ``gguf`` package's own quantizers (``gguf.quants.quantize``, the
numpy ports of llama.cpp's reference code), imported on first use.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..device import return_freed_memory
from ..model import Decoder
from .formats import bits_per_weight, dequantize_int4_groups, quantize_asymmetric, quantize_int4_groups
from .model import is_quantized, linear_layers

__all__ = ["Grid", "GRIDS", "gguf_round_trip", "requantized_weight", "requantize", "RoundedLinear"]


@dataclass(frozen=True)
class Grid:
    """A way to round a weight matrix: its name, its stored bits per weight (scales included),
    what it is in words, and the round trip ``(out, in)`` float32 -> rounded float32."""

    name: str
    bits_per_weight: float
    description: str
    round_trip: Callable[[torch.Tensor], torch.Tensor]


def gguf_round_trip(w: torch.Tensor, type_name: str, *, shift: int = 0) -> torch.Tensor:
    """``w`` ``(out, in)`` quantized with the ``gguf`` package's quantizer for ``type_name``
    (``"Q4_0"``, ``"Q4_1"``, ``"Q5_1"``, ``"Q8_0"``, ...) and dequantized again.

    ``shift`` moves the blocks along each row: the row is rotated left by ``shift`` inputs,
    quantized in blocks of 32, and rotated back, so that block ``k`` covers inputs
    ``32k + shift .. 32k + shift + 31`` (the last one wrapping round to the row's start).
    A rotation only reorders the weights, so nothing else changes."""
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    rows = np.roll(w.detach().float().cpu().numpy(), -shift, axis=1)
    back = gguf.quants.dequantize(gguf.quants.quantize(rows, kind), kind).reshape(rows.shape)
    return torch.from_numpy(np.roll(back, shift, axis=1).copy()).to(w.device)


def _int4(group_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda w: dequantize_int4_groups(*quantize_int4_groups(w, group_size), group_size)


GRIDS: dict[str, Grid] = {g.name: g for g in [
    Grid("Q8_0", bits_per_weight(8, 32, 16), "8-bit symmetric blocks of 32, a float16 scale (gguf)", lambda w: gguf_round_trip(w, "Q8_0")),
    Grid("Q5_1", bits_per_weight(5, 32, 16, 16), "5-bit blocks of 32, a float16 scale and minimum (gguf)", lambda w: gguf_round_trip(w, "Q5_1")),
    Grid("Q4_1", bits_per_weight(4, 32, 16, 16), "the file's own grid, blocks aligned with its blocks (gguf)", lambda w: gguf_round_trip(w, "Q4_1")),
    Grid("Q4_1, shifted 16", bits_per_weight(4, 32, 16, 16), "Q4_1 with the blocks moved 16 weights along the row (gguf)",
         lambda w: gguf_round_trip(w, "Q4_1", shift=16)),
    Grid("Q4_0", bits_per_weight(4, 32, 16), "4-bit symmetric blocks of 32, a float16 scale (gguf)", lambda w: gguf_round_trip(w, "Q4_0")),
    Grid("int4, groups of 64", bits_per_weight(4, 64, 16, 16), "asymmetric int4, a 16-bit scale and zero per 64 weights (kvlib)", _int4(64)),
    # 128 does not divide SmolLM2's 576 inputs: 192 does (576 = 3 × 192, 1,536 = 8 × 192)
    Grid("int4, groups of 192", bits_per_weight(4, 192, 16, 16), "asymmetric int4, a 16-bit scale and zero per 192 weights (kvlib)",
         _int4(192)),
    Grid("3-bit, groups of 32", bits_per_weight(3, 32, 16, 16), "asymmetric 3-bit, a 16-bit scale and minimum per 32 weights (kvlib)",
         lambda w: quantize_asymmetric(w, 3, 32)),
]}


def _grid(name: str) -> Grid:
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}: use one of {', '.join(map(repr, GRIDS))}")
    return GRIDS[name]


def requantized_weight(w: torch.Tensor, grid: str) -> torch.Tensor:
    """``w`` ``(out, in)`` rounded to the grid called ``grid`` (a key of :data:`GRIDS`) and back, float32."""
    return _grid(grid).round_trip(w.detach().float()).to(torch.float32)


class RoundedLinear(nn.Module):
    """``linear`` with its weight rounded to ``grid`` and back each time it runs, the rounded copy
    dropped after the product: the same products as :func:`requantize`'s layer, one layer's
    rounded weight held at a time. ``linear`` itself (its weight) is not changed."""

    def __init__(self, linear: nn.Linear, grid: str) -> None:
        super().__init__()
        _grid(grid)
        self.linear, self.grid = linear, grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight
        return F.linear(x, requantized_weight(w, self.grid).to(w.dtype), self.linear.bias)


def requantize(model: Decoder, grid: str, *, as_it_runs: bool = False) -> Decoder:
    """A copy of the float ``model`` whose linear layers hold their weights rounded to ``grid`` and
    back (:func:`requantized_weight`), still ``nn.Linear`` in the model's dtype: what the rounding
    alone does, with the arithmetic unchanged. The embedding (also the output layer) is not
    rounded, and the copy shares it with ``model`` rather than storing it twice.

    ``as_it_runs=True``: the copy shares every tensor with ``model`` and each linear layer rounds its
    weight when it runs (:class:`RoundedLinear`): the same predictions, without a rounded model
    held in memory, at the cost of rounding again on every forward pass."""
    _grid(grid)
    if is_quantized(model):
        raise ValueError("this model is already quantized: requantize the float model it came from")
    # Shared, not copied: the embedding, and the original weights until each is replaced by its rounded copy
    # (one layer's float copy at a time, never a model's worth); with as_it_runs, every tensor.
    tensors = [*model.parameters(), *model.buffers()] if as_it_runs else \
        [model.embed.weight, *(linear.weight for _, _, linear in linear_layers(model))]
    out = copy.deepcopy(model, memo={id(t): t for t in tensors})
    for parent, name, linear in linear_layers(out):
        if as_it_runs:
            setattr(parent, name, RoundedLinear(linear, grid))
        else:
            weight: nn.Parameter = linear.weight
            linear.weight = nn.Parameter(requantized_weight(weight, grid).to(weight.dtype),
                                         requires_grad=weight.requires_grad)
    return_freed_memory()                                               # the rounding's temporaries
    return out.eval()
