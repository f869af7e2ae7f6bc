"""Rotary position embedding (RoPE), rotate-half convention.

Each pair of channels ``(i, i + head_dim/2)`` of a query or key is rotated by an angle
``position * theta**(-2i/head_dim)``. The angle depends on the absolute position, which
is why a cached decoder must tell RoPE where the new tokens sit: their *positions*, one per
token, ``(batch, seq)`` (:meth:`kvlib.KVCache.positions` gives them for a cache). An int ``p``
is shorthand for one sequence whose tokens sit at ``p, p + 1, ...`` (:func:`as_positions`).
"""
from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables for positions ``0 .. max_seq_len - 1``.

    The tables are computed once in float64 and stored as non-persistent buffers, so
    ``.to(dtype)`` and ``.to(device)`` carry them along and no step recomputes them.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)  # (seq, head_dim/2)
        angles = torch.cat([angles, angles], dim=-1)                                      # (seq, head_dim)
        self.register_buffer("cos", angles.cos().to(torch.get_default_dtype()), persistent=False)
        self.register_buffer("sin", angles.sin().to(torch.get_default_dtype()), persistent=False)

    def forward(self, x: torch.Tensor, positions: int | torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``(batch, heads, seq, head_dim)``; token ``j`` of row ``b`` sits at
        position ``positions[b, j]`` (``positions`` is ``(batch, seq)``, or ``(1, seq)`` for
        every row alike, or an int: see :func:`as_positions`)."""
        return self.at(as_positions(positions, x.shape[-2], self.cos.device))(x)

    def at(self, positions: torch.Tensor) -> "Rotation":
        """The rotation of ``positions`` ``(batch, seq)``, looked up once: a forward pass rotates
        the queries and keys of every layer by the same positions (:meth:`kvlib.Decoder.run`)."""
        return Rotation(self.cos[positions][:, None], self.sin[positions][:, None])


class Rotation:
    """RoPE's angles for one set of positions: ``cos`` and ``sin`` ``(batch, 1, seq, head_dim)``,
    the same for every head. Called like a :class:`RotaryEmbedding` (the positions are already in it)."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.cos, self.sin = cos, sin

    def __call__(self, x: torch.Tensor, positions: object = None) -> torch.Tensor:
        return x * self.cos.to(x.dtype) + rotate_half(x) * self.sin.to(x.dtype)


def as_positions(positions: int | torch.Tensor, seq: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Positions as a tensor: an int ``p`` means ``seq`` tokens at ``p, p + 1, ...`` (``(1, seq)``);
    a tensor is returned as it is."""
    if isinstance(positions, torch.Tensor):
        return positions
    return torch.arange(positions, positions + seq, device=device)[None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)
