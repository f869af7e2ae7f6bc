"""Sliding-window attention: keep only the last ``window`` positions, in a ring buffer."""
from __future__ import annotations

import torch

from ..checks import positive_int
from .base import KVCache, LayerCache, LayerKVCache


class SlidingWindowLayerCache(LayerKVCache):
    """Keys and values of one layer for the last ``window`` positions only: a ring buffer
    ``(batch, kv_heads, window, head_dim)`` where position ``p`` lives in slot ``p % window``,
    and ``ring_positions`` ``(batch, window)``, the position each slot holds (``-1``: none yet).

    Keeps the :class:`~kvlib.cache.LayerCache` contract: ``update`` stores the new keys and
    values and returns those the new queries may attend to, with their positions; attention
    reads ``window`` and lets each query see only the last ``window`` of them.
    """

    def __init__(self, batch: int, n_kv_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__(batch, n_kv_heads, window, head_dim, dtype, device)    # a ring of `window` slots
        self.window = window
        self.ragged_prefill = False
        self.register_buffer("ring_positions", torch.full((batch, window), -1, device=device), persistent=False)

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               end: int, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One new token per row: written into its slot, and the whole ring returned (in ring
        order, not in position order: the positions say where each key sits). A chunk of
        several tokens: the ring as it was followed by the chunk's own keys (a new tensor,
        made before any slot is overwritten), then the chunk's last ``window`` positions stored.

        A slot holds a key of the row's current text or of a position the row has not reached
        yet (a previous text, padding): the ring is written in order of position, so a stale
        slot always holds a later position than the query, which never sees it."""
        w, t = self.window, k.shape[2]
        if t == 1:
            self.store(positions, k, v)
            return self.k, self.v, self.ring_positions
        keys = torch.cat([self.k, k], dim=2)                       # (batch, kv_heads, window + t, head_dim)
        values = torch.cat([self.v, v], dim=2)
        key_positions = torch.cat([self.ring_positions, positions], dim=1)
        keep = slice(t - min(t, w), t)                              # only the chunk's last `window` positions stay
        self.store(positions[:, keep], k[:, :, keep], v[:, :, keep])
        return keys, values, key_positions

    def store(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write at most ``window`` consecutive positions per row into their slots."""
        slots = positions % self.window
        self.write("k", slots, k)
        self.write("v", slots, v)
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        self.ring_positions[rows, slots] = positions

    def rows(self, start: int, stop: int) -> "SlidingWindowLayerCache":
        view = super().rows(start, stop)
        view._buffers["ring_positions"] = self.ring_positions[start:stop]
        return view


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
