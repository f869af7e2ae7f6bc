"""Layers whose weights are GGUF blocks, multiplied by kvlib's own CPU kernels (:mod:`.kernels`).

- :class:`Q4_1Linear`: the 4-bit layers, as Q4_1 blocks (``w = d · q + m`` per 32 weights, ``d``
  and ``m`` in float16), made from a :class:`~kvlib.quant.Int4Linear` with the same integers;
- :class:`Q8_0Linear`: the output layer, as Q8_0 blocks (``w = d · q`` per 32), made from the
  embedding: the file's own Q8_0 blocks again when the embedding holds them decoded in float32.

Both take activations of any float dtype and hand back that dtype; inside, the kernels round
each row of activations to 8-bit integers in blocks of 32. The fast path chooses them by
measurement (:mod:`kvlib.fast.choose`); a learner's model never contains them.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..quant.linear import COMPUTE_DTYPE, Int4Linear
from . import kernels

__all__ = ["q4_1_blocks", "q8_0_blocks", "int4_integers", "Q4_1Linear", "Q8_0Linear"]


def _half_bits(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.float().numpy(), dtype=np.float16).view(np.uint8).reshape(*t.shape, 2)   # (..., 2) bytes


def q4_1_blocks(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """ggml's Q4_1 blocks for ``q`` (0..15) ``(out, in)`` and ``d``, ``m`` ``(out, in/32)``, rounded to
    float16: ``(out, in/32 · 20)`` uint8, each block ``d, m, 16 bytes`` (low nibbles weights 0..15)."""
    out, inp = q.shape
    g = q.to(torch.uint8).reshape(out, inp // kernels.BLOCK, kernels.BLOCK).numpy()
    nibbles = g[..., :16] | (g[..., 16:] << 4)                                          # (out, b, 16)
    blocks = np.concatenate([_half_bits(d), _half_bits(m), nibbles], axis=-1)           # (out, b, 20)
    return torch.from_numpy(np.ascontiguousarray(blocks.reshape(out, -1)))


def q8_0_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w`` ``(out, in)`` quantized as llama.cpp's Q8_0 does (``d = amax / 127`` per 32, rounded to
    float16; ``q = round(w / d)``): ``(blocks (out, in/32 · 34) uint8, q (out, in) int8, d (out, in/32))``
    with ``d`` as stored. Weights that are Q8_0 blocks decoded in float32 give those blocks back."""
    out, inp = w.shape
    g = w.detach().float().cpu().reshape(out, inp // kernels.BLOCK, kernels.BLOCK)
    amax = g.abs().amax(dim=-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(g * inv[..., None]).clamp(-127, 127).to(torch.int8)                   # (out, b, 32)
    d = (amax / 127).half().float()
    blocks = np.concatenate([_half_bits(d), q.numpy().view(np.uint8)], axis=-1)          # (out, b, 34)
    return torch.from_numpy(np.ascontiguousarray(blocks.reshape(out, -1))), q.reshape(out, inp), d


def int4_integers(layer: Int4Linear) -> torch.Tensor:
    """The 4-bit integers ``q`` (0..15) ``(out, in)`` of an :class:`~kvlib.quant.Int4Linear`, exactly:
    its own kernel run on the identity with every scale 1 and zero 8 gives ``(q - 8) + 8``."""
    eye = torch.eye(layer.in_features, dtype=COMPUTE_DTYPE)
    scales = layer.kernel_scales.cpu()                                                    # (groups, out, 2)
    ones = torch.stack([torch.ones_like(scales[..., 0]), torch.full_like(scales[..., 1], 8.0)], dim=-1)
    w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, layer.packed.cpu(), layer.group_size, ones)   # (in, out)
    return w_t.t().round().to(torch.uint8)


class Q4_1Linear(nn.Module):
    """``y = x @ Wᵀ`` with ``W`` in Q4_1 blocks, by :func:`torch.ops.kvlib_cpu.q4_1_mm` (CPU only)."""

    def __init__(self, blocks: torch.Tensor, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("blocks", blocks.contiguous())

    @classmethod
    def from_int4(cls, layer: Int4Linear) -> "Q4_1Linear":
        """The same integers as ``layer`` (groups of 32), ``d = scale`` and ``m = zero - 8 · scale``
        rounded to float16."""
        if layer.group_size != kernels.BLOCK:
            raise ValueError(f"Q4_1 blocks hold 32 weights; this Int4Linear has groups of {layer.group_size}")
        scale, zero = layer.kernel_scales.float().cpu().unbind(-1)                           # (groups, out) each
        d, m = scale.t(), (zero - 8 * scale).t()
        return cls(q4_1_blocks(int4_integers(layer), d, m), layer.in_features, layer.out_features)

    def dequantized(self) -> torch.Tensor:
        """The weight these blocks stand for, ``d · q + m``: ``(out, in)`` float32."""
        b = self.blocks.cpu().numpy().reshape(self.out_features, -1, 20)                    # (out, blocks, 20)
        d = torch.from_numpy(b[..., 0:2].copy().view(np.float16).astype(np.float32))       # (out, blocks, 1)
        m = torch.from_numpy(b[..., 2:4].copy().view(np.float16).astype(np.float32))
        nib = torch.from_numpy(b[..., 4:].copy())                                            # (out, blocks, 16)
        q = torch.cat([nib & 0x0F, nib >> 4], dim=-1).float()                                # (out, blocks, 32)
        return (d * q + m).reshape(self.out_features, self.in_features).to(self.blocks.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kvlib_cpu.q4_1_mm(x, self.blocks, self.out_features)      # (..., in) -> (..., out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q4_1 blocks, kvlib's kernel"


class Q8_0Linear(nn.Module):
    """``y = x @ Wᵀ`` with ``W`` in Q8_0 blocks, by :func:`torch.ops.kvlib_cpu.q8_0_mm` (CPU only)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("blocks", q8_0_blocks(weight)[0])

    def dequantized(self) -> torch.Tensor:
        """The weight these blocks stand for, ``d · q``: ``(out, in)`` float32."""
        b = self.blocks.cpu().numpy().reshape(self.out_features, -1, 2 + kernels.BLOCK)     # (out, blocks, 34)
        d = torch.from_numpy(b[..., :2].copy().view(np.float16).astype(np.float32))        # (out, blocks, 1)
        q = torch.from_numpy(b[..., 2:].copy().view(np.int8)).float()                        # (out, blocks, 32)
        return (d * q).reshape(self.out_features, self.in_features).to(self.blocks.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kvlib_cpu.q8_0_mm(x, self.blocks, self.out_features)      # (..., in) -> (..., out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q8_0 blocks, kvlib's kernel"
