"""Number formats for weights: integers and scales, by hand.

A quantized weight is a small integer ``q`` and a scale (and, for an asymmetric format, a
zero point) shared by a group of weights, so that ``w ≈ dequantize(q)``:

- **int8, per output channel, symmetric**: one scale per row, ``w ≈ q · scale`` with ``q`` in
  ``-127 .. 127`` and ``scale = max|row| / 127``;
- **int4, per group, asymmetric**: one scale and one zero per ``group_size`` weights along
  the input dimension, ``w ≈ (q - 8) · scale + zero`` with ``q`` in ``0 .. 15``,
  ``scale = (max - min) / 15`` and ``zero = min + 8 · scale`` (the convention of PyTorch's
  int4 kernel and of gpt-fast);
- **Q4_1**, llama.cpp's block format, in the model file: 32 weights share a scale ``d`` and a
  minimum ``m``, ``w = d · q + m``: the same as int4 groups of 32 with ``scale = d`` and
  ``zero = m + 8 d``.

Two 4-bit integers fit in one byte (:func:`pack_int4`). Every round trip keeps
``|w - dequantize(quantize(w))| <= scale / 2`` (``tests/quant/test_quant.py``).
"""
from __future__ import annotations

import numpy as np
import torch

from ..checks import positive_int
from ..rounding import asymmetric_range, fake_quantize, from_grid, symmetric_scale, to_grid

__all__ = ["quantize_int8_rows", "dequantize_int8_rows", "quantize_int4_groups", "dequantize_int4_groups",
           "quantize_symmetric", "quantize_asymmetric", "pack_int4", "unpack_int4", "bits_per_weight", "Q4_1_BLOCK", "Q8_0_BLOCK",
           "q4_1_blocks", "q4_1_as_int4_groups", "pack_q4_1", "unpack_q4_1"]

Q4_1_BLOCK = 32          # weights per block: 2 float16 (d, m) + 16 bytes of nibbles = 20 bytes
Q8_0_BLOCK = 32          # weights per block: 1 float16 (d) + 32 int8 = 34 bytes


def quantize_int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per row (output channel) of ``w`` ``(out, in)``:
    ``(q int8 (out, in), scale (out,))`` with ``w ≈ q * scale[:, None]``."""
    scale = symmetric_scale(w, 8, dim=1)                                         # (out, 1)
    return to_grid(w, scale, lo=-127, hi=127).to(torch.int8), scale[:, 0]


def dequantize_int8_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return from_grid(q.float(), scale.float()[:, None])


def _groups(w: torch.Tensor, group_size: int) -> torch.Tensor:
    positive_int("group_size", group_size)
    if w.dim() != 2 or w.shape[1] % group_size:
        raise ValueError(f"group_size={group_size} must divide the input width {w.shape[-1]} of a (out, in) "
                         f"weight; choose a divisor, e.g. 32")
    return w.reshape(w.shape[0], w.shape[1] // group_size, group_size)          # (out, groups, group_size)


def quantize_int4_groups(w: torch.Tensor, group_size: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 in groups of ``group_size`` along the input dimension of ``w`` ``(out, in)``:
    ``(q uint8 in 0..15 (out, in), scale (out, in/g), zero (out, in/g))`` with
    ``w ≈ (q - 8) * scale + zero`` per group."""
    g = _groups(w.float(), group_size)
    scale, lo = asymmetric_range(g, 4, dim=-1, min_scale=1e-12)                   # (out, groups, 1) each
    q = to_grid(g, scale, lo, lo=0, hi=15).to(torch.uint8)
    return q.reshape(w.shape), scale[..., 0], (lo + 8 * scale)[..., 0]


def dequantize_int4_groups(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    g = _groups(q.float(), group_size)
    return from_grid(g - 8, scale[..., None].float(), zero[..., None].float()).reshape(q.shape)


def quantize_symmetric(w: torch.Tensor, bits: int, group_size: int | None = None, *, axis: str = "group") -> torch.Tensor:
    """``w`` rounded to ``bits``-bit symmetric integers and back, with one scale per tensor
    (``axis="tensor"``), per output row (``"channel"``) or per ``group_size`` weights of a row
    (``"group"``): what each choice of scale costs, in the weights' own units."""
    if axis == "tensor":
        return fake_quantize(w, bits, None)
    if axis == "channel":
        return fake_quantize(w, bits, 1)
    return fake_quantize(_groups(w, group_size or 32), bits, -1).reshape(w.shape)


def quantize_asymmetric(w: torch.Tensor, bits: int, group_size: int = 32) -> torch.Tensor:
    """``w`` ``(out, in)`` rounded to ``bits``-bit asymmetric integers (``0 .. 2^bits - 1``, from each
    group's minimum to its maximum) in groups of ``group_size`` inputs, and back: any width, where
    :func:`quantize_int4_groups` is the 4-bit one with its integers kept. Off by at most half a step."""
    positive_int("bits", bits)
    return fake_quantize(_groups(w.float(), group_size), bits, -1, symmetric=False).reshape(w.shape)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit integers (``0..15``) per byte along the last dimension: element ``2i`` in the low
    nibble, ``2i + 1`` in the high one. ``(..., 2n) -> (..., n)`` uint8."""
    if q.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even number of values in the last dimension, got {q.shape[-1]}")
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: ``(..., n) -> (..., 2n)``."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def bits_per_weight(bits: int, group_size: int | None, scale_bits: int = 16, zero_bits: int = 0) -> float:
    """Stored bits per weight: the integer itself plus its share of the group's scale (and zero)."""
    return bits + ((scale_bits + zero_bits) / group_size if group_size else 0.0)


def q4_1_blocks(raw: np.ndarray, n_weights: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Q4_1 blocks of a GGUF tensor (its raw bytes) as ``(d, m, q)``: float16 scales and minima,
    ``(blocks,)`` each, and the 4-bit integers, ``(blocks, 32)`` uint8, in weight order.

    A block is 20 bytes (ggml's ``block_q4_1``): ``d`` (float16), ``m`` (float16), then 16
    bytes whose low nibbles are weights 0..15 of the block and high nibbles weights 16..31.
    """
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, 20)
    if blocks.shape[0] * Q4_1_BLOCK != n_weights:
        raise ValueError(f"{blocks.shape[0]} Q4_1 blocks hold {blocks.shape[0] * Q4_1_BLOCK} weights, "
                         f"the tensor has {n_weights}")
    d = torch.from_numpy(blocks[:, 0:2].copy().view(np.float16).reshape(-1))
    m = torch.from_numpy(blocks[:, 2:4].copy().view(np.float16).reshape(-1))
    qs = torch.from_numpy(blocks[:, 4:].copy())                                  # (blocks, 16)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1)                                    # (blocks, 32): low nibbles first
    return d, m, q


def q4_1_as_int4_groups(raw: np.ndarray, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_1 matrix of ``shape`` ``(out, in)`` as int4 groups of 32 (:func:`quantize_int4_groups`'s
    format), exactly: ``q`` unchanged, ``scale = d``, ``zero = m + 8 d`` (in float32)."""
    out, inp = shape
    d, m, q = q4_1_blocks(raw, out * inp)
    d, m = d.float().reshape(out, inp // Q4_1_BLOCK), m.float().reshape(out, inp // Q4_1_BLOCK)
    return q.reshape(out, inp), d, m + 8 * d


def pack_q4_1(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks, byte for byte as ggml lays them out, from ``q`` (0..15) ``(out, in)`` and ``d``,
    ``m`` ``(out, in/32)`` (rounded to float16 here): ``(out, in/32 · 20)`` uint8, each block ``d``,
    ``m``, then 16 bytes whose low nibbles are the block's weights 0..15 and high nibbles 16..31."""
    out, inp = q.shape
    g = q.to(torch.uint8).reshape(out, inp // Q4_1_BLOCK, Q4_1_BLOCK)                   # (out, blocks, 32)
    nibbles = g[..., :16] | (g[..., 16:] << 4)                                           # (out, blocks, 16)
    dm = torch.stack([d, m], dim=-1).to(torch.float16).contiguous().view(torch.uint8)    # (out, blocks, 4)
    return torch.cat([dm, nibbles], dim=-1).reshape(out, -1)


def unpack_q4_1(blocks: torch.Tensor, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack_q4_1`, on any device: ``(q uint8 (out, in), d, m)`` with ``d`` and
    ``m`` ``(out, in/32)`` float32 (their float16 values), so that ``w = d · q + m`` per block."""
    out, inp = shape
    b = blocks.reshape(out, inp // Q4_1_BLOCK, 20)                                       # (out, blocks, 20)
    d = b[..., 0:2].contiguous().view(torch.float16)[..., 0].float()                     # (out, blocks)
    m = b[..., 2:4].contiguous().view(torch.float16)[..., 0].float()
    nibbles = b[..., 4:]                                                                  # (out, blocks, 16)
    q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).reshape(out, inp)
    return q, d, m
