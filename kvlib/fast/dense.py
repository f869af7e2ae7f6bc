"""The fast path's kernel for many rows: a packed kernel for a few rows, a dense weight for many."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..quant.linear import Kernel, QuantizedLinear

__all__ = ["DenseFrom"]


class DenseFrom(Kernel):
    """``kernel`` for inputs of fewer than ``rows`` rows (tokens), else ``F.linear`` with the layer's
    weights dequantized once into ``dtype`` (kept as the layer's buffer ``dense``; the input cast
    to it and the result back).

    At one row a step only reads the weights, and a packed kernel reads a fraction of a dense
    weight's bytes; with many rows the arithmetic catches up and a dense product may win. Where the
    switch lies is measured on each machine (:func:`kvlib.fast.kernel_choice`).
    """

    def __init__(self, kernel: Kernel, rows: int, dtype: torch.dtype) -> None:
        if isinstance(kernel, DenseFrom) or rows < 1:
            raise ValueError(f"DenseFrom takes a packed kernel and a row count of at least 1, got {kernel!r}, {rows}")
        self.kernel, self.rows, self.dtype = kernel, rows, dtype
        self.name = f"{kernel.name}, dense {str(dtype).removeprefix('torch.')} from {rows} rows on"

    def prepare(self, layer: QuantizedLinear) -> None:
        self.kernel.prepare(layer)
        layer.derive("dense", layer.dequantized().to(self.dtype))                           # (out, in)

    def forward(self, layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // x.shape[-1] < self.rows:
            return self.kernel.forward(layer, x)
        return F.linear(x.to(layer.dense.dtype), layer.dense).to(x.dtype)

    def step_bytes(self, layer: QuantizedLinear) -> int:
        """What one row reads: the packed kernel's weights (the dense copy serves many rows only)."""
        return self.kernel.step_bytes(layer)
