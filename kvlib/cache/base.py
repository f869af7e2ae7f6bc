"""The KV cache: preallocated key/value buffers, one pair per layer (after gpt-fast's KVCache).

Keys and values of earlier tokens never change (a token only looks backwards), so they
are computed once, written here, and read back at every later step.

Every layer cache keeps one contract, :class:`LayerCache`: ``update(pos, k, v)`` stores the
new keys and values and returns those the new queries may attend to, and ``window`` says
whether attention must restrict them further (a sliding window) or not (``None``). A model's
cache, :class:`KVCache`, holds one layer cache per layer and counts the stored positions;
caches that store keys and values differently (a ring buffer, int8, 16 bits) change only
the layer type, through :meth:`KVCache.make_layer`.
"""
from __future__ import annotations

import copy
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ..checks import non_negative_int, positive_int


@runtime_checkable
class LayerCache(Protocol):
    """What :class:`kvlib.attention.Attention` needs from the cache of its layer."""

    window: int | None
    """``None``: a query may attend to every key ``update`` returns (the causal mask aside).
    An int ``W``: only to the last ``W`` positions up to itself (sliding-window attention)."""

    def update(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v`` ``(batch, kv_heads, seq, head_dim)`` for positions ``pos .. pos+seq-1``
        and return the keys and values the new queries may attend to,
        ``(batch, kv_heads, k_len, head_dim)`` each, the new ones last."""
        ...


class LayerKVCache(nn.Module):
    """Keys and values of one attention layer: two buffers ``(batch, kv_heads, max_len, head_dim)``."""

    window: int | None = None

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__()
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, pos: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` of shape ``(batch, kv_heads, seq, head_dim)`` at ``pos``; return all keys/values so far.

        ``pos`` is one slot for the whole batch, or a ``(batch,)`` tensor of one slot per row
        (rows of different lengths). The returned tensors are views of the buffers (no copy),
        ``(batch, kv_heads, end, head_dim)`` where ``end`` is the furthest slot written, plus one.
        """
        t = k.shape[2]
        if not isinstance(pos, torch.Tensor):
            end = pos + t
            self.k[:, :, pos:end] = k
            self.v[:, :, pos:end] = v
            return self.k[:, :, :end], self.v[:, :, :end]
        if t == 1:                                    # one new token per row, each at its own slot
            rows = torch.arange(k.shape[0], device=k.device)
            self.k[rows, :, pos] = k[:, :, 0]         # (batch, kv_heads, head_dim) into (batch, ·, slot, ·)
            self.v[rows, :, pos] = v[:, :, 0]
        else:
            for row, start in enumerate(pos.tolist()):
                self.k[row, :, start:start + t] = k[row]
                self.v[row, :, start:start + t] = v[row]
        end = int(pos.max()) + t
        return self.k[:, :, :end], self.v[:, :, :end]

    def rows(self, start: int, stop: int) -> "LayerKVCache":
        """This layer's cache for rows ``start .. stop-1`` of the batch, in the same memory: what
        is written through it lands in this cache (to fill one row of a batch on its own)."""
        view = copy.copy(self)
        view._buffers = {name: buf[start:stop] for name, buf in self._buffers.items()}
        return view

    @property
    def nbytes(self) -> int:
        """Bytes of this layer's buffers (allocated, not just used)."""
        return sum(b.nbytes for b in self.buffers())


class KVCache(nn.Module):
    """A KV cache for a whole decoder: one layer cache per layer and a position counter.

    ``pos`` is the number of tokens already stored; the decoder writes new tokens there
    and rotates them as positions ``pos, pos+1, ...`` (the RoPE offset). Only the cache
    moves ``pos``: :meth:`advance` after a forward pass, :meth:`reset` and :meth:`truncate`.

    ``dtype`` is the dtype the model computes in, which is what the cache hands back. A
    subclass that stores keys and values in another form overrides :meth:`make_layer`.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        kind = type(self).__name__
        for name, value in dict(n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads,
                                max_len=max_len, head_dim=head_dim).items():
            positive_int(f"{kind}: {name}", value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"{kind}: dtype is the floating-point dtype the model computes in, got {dtype}")
        self.batch, self.max_len, self._dtype = batch, max_len, dtype
        self.layers = nn.ModuleList(
            self.make_layer(batch, n_kv_heads, max_len, head_dim, dtype, device) for _ in range(n_layers))
        self.pos = 0

    def make_layer(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device | str | None) -> LayerCache:
        """One layer's cache: the hook a cache that stores keys and values differently overrides."""
        return LayerKVCache(batch, n_kv_heads, max_len, head_dim, dtype, device)

    @classmethod
    def for_model(cls, model: nn.Module, batch: int = 1, max_len: int | None = None, **kwargs) -> "KVCache":
        """A cache shaped for ``model`` (a :class:`kvlib.Decoder`), on its device and in its dtype,
        for ``max_len`` positions (default: the model's ``max_seq_len``); ``kwargs`` go to the
        constructor of ``cls`` (``window=`` for a sliding window, ``storage=`` for 16 bits, ...)."""
        cfg = model.config
        p = next(model.parameters())
        return cls(n_layers=cfg.n_layers, batch=batch, n_kv_heads=cfg.n_kv_heads, max_len=max_len or cfg.max_seq_len,
                   head_dim=cfg.head_dim, dtype=p.dtype, device=p.device, **kwargs)

    def rows(self, start: int, stop: int) -> "KVCache":
        """This cache for rows ``start .. stop-1`` of the batch, in the same memory: a smaller
        cache whose writes land here. Its ``pos`` starts at this cache's and moves on its own."""
        if not 0 <= start < stop <= self.batch:
            raise ValueError(f"rows {start}..{stop - 1} are not rows of a batch of {self.batch}")
        view = copy.copy(self)
        view._modules = dict(self._modules)
        view.layers = nn.ModuleList(layer.rows(start, stop) for layer in self.layers)
        view.batch = stop - start
        return view

    def check_room(self, n_new: int) -> None:
        """Raise a clear error if ``n_new`` more tokens would not fit."""
        if self.pos + n_new > self.max_len:
            raise ValueError(
                f"KV cache is full: it holds {self.pos} of max_len={self.max_len} positions and cannot "
                f"take {n_new} more (would need {self.pos + n_new}). Build a larger cache "
                f"(KVCache.for_model(model, max_len=...)) or call reset().")

    def advance(self, n_new: int) -> None:
        """Count ``n_new`` more stored tokens (the decoder calls this after writing them)."""
        self.check_room(n_new)
        self.pos += n_new

    def reset(self) -> None:
        """Forget every stored token (the buffers are kept and simply overwritten later)."""
        self.pos = 0

    def truncate(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` stored tokens: the next write goes to position
        ``n_tokens`` (to run the same step again, or to take back tokens that were rejected)."""
        non_negative_int("n_tokens", n_tokens)
        if n_tokens > self.pos:
            raise ValueError(f"cannot truncate to {n_tokens} tokens: the cache holds only {self.pos}")
        self.pos = n_tokens

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the cache hands keys and values back in (what the model computes in)."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        return next(self.layers[0].buffers()).device

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's buffers (allocated, not just used)."""
        return sum(layer.nbytes for layer in self.layers)

    def extra_repr_fields(self) -> str:
        """What :meth:`__repr__` shows beside the shape; a subclass adds its own options."""
        return ""

    def __repr__(self) -> str:
        k = self.layers[0].k
        extra = self.extra_repr_fields()
        return (f"{type(self).__name__}(layers={len(self.layers)}, {extra + ', ' if extra else ''}"
                f"shape per buffer={tuple(k.shape)}, stored as {k.dtype}, returns {self.dtype}, pos={self.pos}, "
                f"{self.nbytes / 2**20:.2f} MiB)")
