"""Sliding-window attention: keep only the last ``window`` positions, in a ring buffer."""
from __future__ import annotations

import torch

from ..checks import positive_int
from .base import KVCache, LayerCache, LayerKVCache


class SlidingWindowLayerCache(LayerKVCache):
    """Keys and values of one layer for the last ``window`` positions only: a ring buffer
    ``(batch, kv_heads, window, head_dim)`` where position ``p`` lives in slot ``p % window``.

    Keeps the :class:`~kvlib.cache.LayerCache` contract: ``update(pos, k, v)`` stores the new
    keys and values and returns those the new queries may attend to; attention reads
    ``window`` and restricts each query to the last ``window`` keys.
    """

    def __init__(self, batch: int, n_kv_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__(batch, n_kv_heads, window, head_dim, dtype, device)    # a ring of `window` slots
        self.window = window

    def update(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v`` ``(batch, kv_heads, seq, head_dim)`` for positions ``pos .. pos+seq-1``.

        One new token (``seq == 1``): returns views of the ring, the last ``min(pos+1, window)``
        positions (in ring order, not in position order: with a single query and no mask the
        order of the keys does not matter, their rotation already says where each one sits).
        A chunk of several tokens: returns, in position order, the stored keys the chunk's
        first query still sees followed by the chunk's own (a new tensor), for the banded mask.
        """
        w, t = self.window, k.shape[2]
        if t == 1:
            slot = pos % w
            self.k[:, :, slot] = k[:, :, 0]
            self.v[:, :, slot] = v[:, :, 0]
            n = min(pos + 1, w)
            return self.k[:, :, :n], self.v[:, :, :n]
        # positions max(0, pos - w + 1) .. pos - 1 are still inside the first new query's window
        old = torch.arange(max(0, pos - w + 1), pos, device=self.k.device) % w
        k_all = torch.cat([self.k[:, :, old], k], dim=2)       # gathered (a copy) before any slot is overwritten
        v_all = torch.cat([self.v[:, :, old], v], dim=2)
        keep = min(t, w)                                        # only the chunk's last `window` positions stay
        slots = torch.arange(pos + t - keep, pos + t, device=self.k.device) % w
        self.k[:, :, slots] = k[:, :, t - keep:]
        self.v[:, :, slots] = v[:, :, t - keep:]
        return k_all, v_all


class SlidingWindowKVCache(KVCache):
    """A KV cache for sliding-window attention: every layer keeps only the last ``window``
    positions (a ring buffer), so its memory does not grow with the number of tokens.

    Used with a :class:`kvlib.Decoder` like :class:`kvlib.KVCache`; the attention layers then
    let each token see only the last ``window`` tokens, itself included (as Mistral-7B does
    with a window of 4,096). Positions keep counting (for RoPE) up to ``max_len``.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 max_len: int = 2**31 - 1) -> None:
        self.window = positive_int("SlidingWindowKVCache: window", window)
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim, dtype, device)

    def make_layer(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device | str | None) -> LayerCache:
        return SlidingWindowLayerCache(batch, n_kv_heads, self.window, head_dim, dtype, device)

    def extra_repr_fields(self) -> str:
        return f"window={self.window}"
