"""The KV cache: preallocated key/value buffers, one pair per layer (after gpt-fast's KVCache).

Keys and values of earlier tokens never change (a token only looks backwards), so they
are computed once, written here, and read back at every later step.
"""
from __future__ import annotations

import torch
from torch import nn


class LayerKVCache(nn.Module):
    """Keys and values of one attention layer: two buffers ``(batch, kv_heads, max_len, head_dim)``."""

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__()
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` of shape ``(batch, kv_heads, seq, head_dim)`` at ``pos``; return all keys/values so far.

        The returned tensors are views of the buffers (no copy): ``(batch, kv_heads, pos + seq, head_dim)``.
        """
        end = pos + k.shape[2]
        self.k[:, :, pos:end] = k
        self.v[:, :, pos:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


class KVCache(nn.Module):
    """A KV cache for a whole decoder: one :class:`LayerKVCache` per layer and a position counter.

    ``pos`` is the number of tokens already stored; the decoder writes new tokens there
    and rotates them as positions ``pos, pos+1, ...`` (the RoPE offset).
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        for name, value in dict(n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads,
                                max_len=max_len, head_dim=head_dim).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}")
        self.batch, self.max_len = batch, max_len
        self.layers = nn.ModuleList(
            self.make_layer(batch, n_kv_heads, max_len, head_dim, dtype, device) for _ in range(n_layers))
        self.pos = 0

    def make_layer(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device | str | None) -> nn.Module:
        """One layer's cache: the hook a cache that stores keys and values differently overrides."""
        return LayerKVCache(batch, n_kv_heads, max_len, head_dim, dtype, device)

    @classmethod
    def for_model(cls, model: nn.Module, batch: int = 1, max_len: int | None = None, **kwargs) -> "KVCache":
        """A cache shaped for ``model`` (a :class:`kvlib.Decoder`), on its device and in its dtype;
        ``kwargs`` go to the constructor of ``cls`` (for a cache with options of its own)."""
        cfg = model.config
        p = next(model.parameters())
        return cls(cfg.n_layers, batch, cfg.n_kv_heads, max_len or cfg.max_seq_len, cfg.head_dim,
                   dtype=p.dtype, device=p.device, **kwargs)

    def check_room(self, n_new: int) -> None:
        """Raise a clear error if ``n_new`` more tokens would not fit."""
        if self.pos + n_new > self.max_len:
            raise ValueError(
                f"KV cache is full: it holds {self.pos} of max_len={self.max_len} positions and cannot "
                f"take {n_new} more (would need {self.pos + n_new}). Build a larger cache "
                f"(KVCache.for_model(model, max_len=...)) or call reset().")

    def advance(self, n_new: int) -> None:
        self.check_room(n_new)
        self.pos += n_new

    def reset(self) -> None:
        """Forget every stored token (the buffers are kept and simply overwritten later)."""
        self.pos = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].k.dtype

    @property
    def device(self) -> torch.device:
        return self.layers[0].k.device

    @property
    def nbytes(self) -> int:
        """Bytes held by all key and value buffers (allocated, not just used)."""
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)

    def __repr__(self) -> str:
        k = self.layers[0].k
        return (f"KVCache(layers={len(self.layers)}, shape per buffer={tuple(k.shape)}, dtype={k.dtype}, "
                f"pos={self.pos}, {self.nbytes / 2**20:.2f} MiB)")


# =======================================================================================
# Sliding-window attention: keep only the last `window` positions, in a ring buffer
# =======================================================================================

class SlidingWindowLayerCache(nn.Module):
    """Keys and values of one layer for the last ``window`` positions only: a ring buffer
    ``(batch, kv_heads, window, head_dim)`` where position ``p`` lives in slot ``p % window``.

    Same contract as :class:`LayerKVCache`: ``update(pos, k, v)`` stores the new keys and
    values and returns the keys and values the new queries may attend to. Attention reads
    the cache's ``window`` and restricts each query to the last ``window`` keys.
    """

    def __init__(self, batch: int, n_kv_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__()
        self.window = window
        shape = (batch, n_kv_heads, window, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

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

    Used with a :class:`kvlib.Decoder` like :class:`KVCache`; the attention layers then let
    each token see only the last ``window`` tokens, itself included (as Mistral-7B does with
    a window of 4,096). Positions keep counting (for RoPE) up to ``max_len``.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, window: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 max_len: int = 2**31 - 1) -> None:
        nn.Module.__init__(self)
        for name, value in dict(n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads, window=window,
                                head_dim=head_dim, max_len=max_len).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SlidingWindowKVCache: {name} must be a positive int, got {value!r}")
        self.batch, self.max_len, self.window = batch, max_len, window
        self.layers = nn.ModuleList(
            SlidingWindowLayerCache(batch, n_kv_heads, window, head_dim, dtype, device) for _ in range(n_layers))
        self.pos = 0

    @classmethod
    def for_model(cls, model: nn.Module, batch: int = 1, max_len: int | None = None, *,
                  window: int) -> "SlidingWindowKVCache":
        """A sliding-window cache shaped for ``model``, on its device and in its dtype, keeping
        ``window`` positions; ``max_len`` (default: the model's ``max_seq_len``) bounds the positions."""
        cfg = model.config
        p = next(model.parameters())
        return cls(cfg.n_layers, batch, cfg.n_kv_heads, window, cfg.head_dim, dtype=p.dtype, device=p.device,
                   max_len=max_len or cfg.max_seq_len)

    def __repr__(self) -> str:
        k = self.layers[0].k
        return (f"SlidingWindowKVCache(layers={len(self.layers)}, window={self.window}, shape per buffer="
                f"{tuple(k.shape)}, dtype={k.dtype}, pos={self.pos}, {self.nbytes / 2**20:.2f} MiB)")
