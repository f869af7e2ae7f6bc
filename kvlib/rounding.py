"""The one rounding primitive of the chapter: numbers to a grid of integers, and back.

Every quantized format here, of the KV cache (:mod:`kvlib.cache.quantized`) and of the
weights (:mod:`kvlib.quant.formats`), is a grid ``offset + scale * q`` with integers ``q`` in
``lo .. hi``, and a rule that picks the scale (and offset) from the numbers it must hold:

- **symmetric**: ``offset = 0``, ``scale = max|x| / (2^(bits-1) - 1)``, ``q`` in ``-top .. top``;
- **asymmetric**: ``offset = min(x)``, ``scale = (max - min) / (2^bits - 1)``, ``q`` in ``0 .. 2^bits - 1``.

Rounding to the nearest grid point is off by at most ``scale / 2``.
"""
from __future__ import annotations

import torch

__all__ = ["to_grid", "from_grid", "symmetric_scale", "asymmetric_range", "fake_quantize"]


def to_grid(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | float = 0.0, *,
            lo: int, hi: int) -> torch.Tensor:
    """The integers ``q = round((x - offset) / scale)``, clamped to ``lo .. hi`` (as floats; cast
    them to the storage dtype). A zero scale (all numbers equal) counts as 1, so ``q`` stays 0."""
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.round((x - offset) / safe).clamp(lo, hi)


def from_grid(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | float = 0.0) -> torch.Tensor:
    """The numbers the integers ``q`` stand for: ``offset + scale * q``."""
    return q * scale + offset


def symmetric_scale(x: torch.Tensor, bits: int, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """``max|x| / (2^(bits-1) - 1)`` over ``dim`` (kept, for broadcasting; ``None``: the whole tensor)."""
    top = 2 ** (bits - 1) - 1
    peak = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    return peak / top


def asymmetric_range(x: torch.Tensor, bits: int, dim: int, *, min_scale: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, minimum)`` over ``dim`` (kept): ``(max - min) / (2^bits - 1)``, at least ``min_scale``."""
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    return ((hi - lo) / (2 ** bits - 1)).clamp(min=min_scale), lo


def fake_quantize(x: torch.Tensor, bits: int, dim: int | None, *, symmetric: bool = True) -> torch.Tensor:
    """``x`` rounded to ``bits``-bit integers with one scale (and, asymmetric, one minimum) per
    slice along ``dim``, and back: what the format keeps of ``x``."""
    if symmetric:
        top = 2 ** (bits - 1) - 1
        scale = symmetric_scale(x, bits, dim)
        return from_grid(to_grid(x, scale, lo=-top, hi=top), scale)
    scale, lo = asymmetric_range(x, bits, dim, min_scale=1e-8)
    return from_grid(to_grid(x, scale, lo, lo=0, hi=2 ** bits - 1), scale, lo)
