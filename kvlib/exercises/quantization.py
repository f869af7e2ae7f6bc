"""Checks for the exercises of *Quantization* (Exercises 8.1 and 8.2).

8.1 counts the bytes of a tensor stored in llama.cpp's formats; the check names the usual
slips (the block's scales forgotten, Q4_0's single scale for Q4_1's two). 8.2 quantizes a
weight matrix to asymmetric int4 in groups; the check names a zero point one step off, a
scale over 16 steps instead of 15, groups taken along the wrong dimension.
"""
from __future__ import annotations

from typing import Callable

import torch

from .framework import Case, diagnose, run_check

__all__ = ["check_gguf_tensor_bytes", "check_quantize_int4"]


# --- Exercise 8.1 ----------------------------------------------------------------------------

_BLOCK = {"F32": (1, 4), "F16": (1, 2), "Q8_0": (32, 34), "Q4_1": (32, 20)}   # (weights, bytes) per block


def _bytes(kind, n_weights, *, per_block=None):
    weights, size = _BLOCK[kind]
    if per_block is not None:
        size = per_block.get(kind, size)
    return n_weights // weights * size


_MISTAKES_BYTES: list[tuple[str, Callable]] = [
    ("the scales are missing: a Q4_1 block stores 32 four-bit integers (16 bytes) and two float16 numbers, "
     "d and m (4 bytes), 20 bytes in all; a Q8_0 block 32 bytes and one float16 scale, 34.",
     lambda kind, n: _bytes(kind, n, per_block={"Q4_1": 16, "Q8_0": 32})),
    ("a Q4_1 block has two float16 numbers, a scale d and a minimum m (w = d·q + m): 20 bytes per 32 "
     "weights. One scale only (18 bytes) is Q4_0.",
     lambda kind, n: _bytes(kind, n, per_block={"Q4_1": 18})),
]


def check_gguf_tensor_bytes(fn: Callable) -> None:
    """Exercise 8.1: ``fn(kind, n_weights)`` is the bytes of a tensor of ``n_weights`` weights
    stored as ``kind`` (``"F32"``, ``"F16"``, ``"Q8_0"`` or ``"Q4_1"``)."""
    specs = [("a Q4_1 layer of SmolLM2 (1536 × 576)", ("Q4_1", 1536 * 576)),
             ("SmolLM2's Q8_0 embedding (49152 × 576)", ("Q8_0", 49152 * 576)),
             ("one Q4_1 block", ("Q4_1", 32)), ("a float32 norm of 576 gains", ("F32", 576)),
             ("a float16 matrix", ("F16", 64 * 64))]
    cases = [Case(name, args, _bytes(*args)) for name, args in specs]
    hint = diagnose(fn, cases, _MISTAKES_BYTES) or ("bytes = number of blocks × bytes per block; F32 and F16 "
                                                    "have one weight per block.")
    run_check("Exercise 8.1", fn, cases, hint=hint)


# --- Exercise 8.2 ----------------------------------------------------------------------------

def _int4(w, group_size, *, zero_shift=8.0, levels=15, transpose=False):
    if transpose:
        q, s, z = _int4(w.t().contiguous(), group_size)
        return q.t(), s, z
    g = w.reshape(w.shape[0], -1, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = (hi - lo) / levels
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).reshape(w.shape)
    return q, scale, lo + zero_shift * scale


_MISTAKES_INT4: list[tuple[str, Callable]] = [
    ("the zero is the group's minimum; with w = (q - 8) · scale + zero it must be min + 8 · scale "
     "(q = 8 stands for the zero).", lambda w, g: _int4(w, g, zero_shift=0.0)),
    ("16 levels lie 15 steps apart: scale = (max - min) / 15, not / 16.", lambda w, g: _int4(w, g, levels=16)),
]


def check_quantize_int4(fn: Callable) -> None:
    """Exercise 8.2: ``fn(w, group_size)`` returns ``(q, scale, zero)`` with ``q`` in 0..15
    ``(out, in)`` and ``scale``, ``zero`` ``(out, in // group_size)``, so that each group of
    ``group_size`` consecutive inputs of a row is ``(q - 8) · scale + zero``."""
    g = torch.Generator().manual_seed(8)
    specs = [("4 rows of 64, groups of 32", (4, 64, 32)), ("one row, one group", (1, 32, 32)),
             ("8 rows of 128, groups of 64", (8, 128, 64)), ("rows far from 0", (3, 64, 32))]
    cases = []
    for name, (rows, cols, group) in specs:
        w = torch.randn(rows, cols, generator=g) + (5.0 if "far" in name else 0.0)
        q, scale, zero = _int4(w, group)
        cases.append(Case(name, (w, group), (q.float(), scale, zero), atol=1e-4))

    def as_floats(w, group_size):
        out = fn(w, group_size)
        return tuple(t.float() if isinstance(t, torch.Tensor) else t for t in out) if isinstance(out, tuple) else out

    hint = diagnose(as_floats, cases, _MISTAKES_INT4 + [
        ("the groups run down the columns: a group is group_size consecutive inputs of one row "
         "(reshape to (out, in // group_size, group_size)).", lambda w, gs: _int4(w, gs, transpose=True))
    ]) or "per group: lo, hi = min, max; scale = (hi - lo) / 15; q = round((w - lo) / scale); zero = lo + 8 · scale."
    run_check("Exercise 8.2", as_floats if callable(fn) else fn, cases, hint=hint)
