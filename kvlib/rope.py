"""Rotary position embedding (RoPE), rotate-half convention.

Each pair of channels ``(i, i + head_dim/2)`` of a query or key is rotated by an angle
``position * theta**(-2i/head_dim)``. The angle depends on the absolute position, which
is why a cached decoder must tell RoPE where the new tokens sit (the *offset*).
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

    def forward(self, x: torch.Tensor, offset: int | torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``(batch, heads, seq, head_dim)`` for positions ``offset .. offset+seq-1``.

        ``offset`` is one int for the whole batch, or a tensor of one offset per row,
        ``(batch,)``, for a batch whose sequences sit at different positions.
        """
        seq = x.shape[-2]
        if isinstance(offset, torch.Tensor):
            positions = offset.to(self.cos.device)[:, None] + torch.arange(seq, device=self.cos.device)  # (batch, seq)
            positions = positions.clamp(min=0)       # (a padding token, before its row's first position: any angle)
            cos = self.cos[positions][:, None].to(x.dtype)       # (batch, 1, seq, head_dim): broadcast over heads
            sin = self.sin[positions][:, None].to(x.dtype)
        else:
            cos = self.cos[offset:offset + seq].to(x.dtype)      # (seq, head_dim)
            sin = self.sin[offset:offset + seq].to(x.dtype)
        return x * cos + rotate_half(x) * sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)
