"""GGUF's block formats multiplied by kvlib's own CPU kernels (:mod:`.kernels`).

- :data:`Q4_1`: the kernel for an :class:`~kvlib.quant.Int4Linear`'s Q4_1 blocks, read as they are
  stored (nothing laid out again);
- :class:`Q8_0Linear`: the output layer in Q8_0 blocks (``w = d · q`` per 32), made from the
  embedding: the file's own Q8_0 blocks again when the embedding holds them decoded in float32;
  its kernel :data:`Q8_0`.

Both kernels take activations of any float dtype and hand back that dtype; inside, they round each
row of activations to 8-bit integers in blocks of 32. The fast path chooses them by measurement
(:mod:`kvlib.fast.choose`); a learner's model never runs them.
"""
from __future__ import annotations

import numpy as np
import torch

from ..quant.linear import Int4Linear, Kernel, QuantizedLinear
from . import kernels

__all__ = ["q8_0_blocks", "Q4_1", "Q8_0", "Q8_0Linear"]


def _half_bits(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.float().numpy(), dtype=np.float16).view(np.uint8).reshape(*t.shape, 2)   # (..., 2) bytes


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


class _Ours(Kernel):
    """A kernel of kvlib's C++ library: it must build here (:func:`kvlib.fast.kernels.load`)."""

    def prepare(self, layer: QuantizedLinear) -> None:
        if not kernels.load():
            raise RuntimeError(f"{self.name} needs kvlib's kernels, which are not here: {kernels.kernels_missing()}")


class Q4_1Kernel(_Ours):
    name = "kvlib's Q4_1 kernel"

    def forward(self, layer: Int4Linear, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kvlib_cpu.q4_1_mm(x, layer.blocks, layer.out_features)       # (..., in) -> (..., out)


class Q8_0Kernel(_Ours):
    name = "kvlib's Q8_0 kernel"

    def forward(self, layer: "Q8_0Linear", x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kvlib_cpu.q8_0_mm(x, layer.blocks, layer.out_features)       # (..., in) -> (..., out)


Q4_1, Q8_0 = Q4_1Kernel(), Q8_0Kernel()


class Q8_0Linear(QuantizedLinear):
    """``y = x @ Wᵀ`` with ``W`` stored in Q8_0 blocks (``blocks``, ``(out, in/32 · 34)`` uint8)."""

    format = "Q8_0 blocks of 32"

    def __init__(self, weight: torch.Tensor, kernel: Kernel = Q8_0) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("blocks", q8_0_blocks(weight)[0])
        self.use(kernel)

    def dequantized(self) -> torch.Tensor:
        """The weight these blocks stand for, ``d · q``: ``(out, in)`` float32."""
        b = self.blocks.reshape(self.out_features, -1, 2 + kernels.BLOCK)                   # (out, blocks, 34)
        d = b[..., :2].contiguous().view(torch.float16).float()                            # (out, blocks, 1)
        q = b[..., 2:].contiguous().view(torch.int8).float()                               # (out, blocks, 32)
        return (d * q).reshape(self.out_features, self.in_features)
