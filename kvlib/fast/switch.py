"""The fast path's layer: a packed kernel for a few rows, a dense weight for many."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["KernelSwitch"]


class KernelSwitch(nn.Module):
    """``packed(x)`` for inputs of fewer than ``dense_from`` rows (tokens), else ``F.linear`` with
    ``dense``, the same weights dequantized once, in ``dense``'s dtype (the input cast to it and the
    result back). ``dense_from=None``: always the packed kernel.

    At one row a step only reads the weights, and a packed kernel reads a fraction of a dense
    weight's bytes; with many rows the arithmetic catches up and a dense product may win. Where the
    switch lies is measured on each machine (:func:`kvlib.fast.kernel_choice`).
    """

    def __init__(self, packed: nn.Module, dense: torch.Tensor | None = None, dense_from: int | None = None) -> None:
        super().__init__()
        if (dense is None) != (dense_from is None):
            raise ValueError("KernelSwitch: give both a dense weight and dense_from, or neither")
        self.packed, self.dense_from = packed, dense_from
        self.in_features, self.out_features = packed.in_features, packed.out_features
        self.register_buffer("dense", dense, persistent=False)                 # (out, in), or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense_from is None or x.numel() // x.shape[-1] < self.dense_from:
            return self.packed(x)
        return F.linear(x.to(self.dense.dtype), self.dense).to(x.dtype)

    def step_bytes(self) -> int:
        """The bytes a one-row step reads: the packed kernel's weights (the dense copy serves only
        steps of ``dense_from`` rows or more)."""
        return sum(t.numel() * t.element_size() for t in [*self.packed.parameters(), *self.packed.buffers()])

    def extra_repr(self) -> str:
        if self.dense_from is None:
            return "the packed kernel at every batch size"
        return f"dense {str(self.dense.dtype).removeprefix('torch.')} from {self.dense_from} rows on"
