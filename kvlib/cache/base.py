"""The KV cache: preallocated key/value buffers, one pair per layer (after gpt-fast's KVCache),
and each row's length (after nanochat's ``cache_seqlens``).

Keys and values of earlier tokens never change (a token only looks backwards), so they
are computed once, written here, and read back at every later step.

The cache owns the one model of position: row ``b`` holds ``lengths[b]`` tokens, so its next
tokens sit at positions ``lengths[b], lengths[b] + 1, ...`` (:meth:`KVCache.positions`); one
sequence is the case of one row. Every layer cache keeps one contract, :class:`LayerCache`:
``update(positions, k, v, end)`` stores the new keys and values of each row at their positions
and returns the keys and values the new queries may attend to, with the position each one
holds. Caches that store keys and values differently (a ring buffer, int8, 16 bits, KIVI)
change only the layer type, through :meth:`KVCache.make_layer`, and so work alone and batched.
"""
from __future__ import annotations

import copy
from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import nn

from ..attention import attention
from ..checks import non_negative_int, positive_int


@runtime_checkable
class LayerCache(Protocol):
    """What :class:`KVCache` needs from the cache of one layer."""

    window: int | None
    """``None``: a query may attend to every earlier key. An int ``W``: only to the last ``W``
    positions up to itself (sliding-window attention)."""

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               end: int, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store ``k, v`` ``(batch, kv_heads, seq, head_dim)``, token ``j`` of row ``b`` at position
        ``positions[b, j]``; return the keys and values the new queries may attend to,
        ``(batch, kv_heads, k_len, head_dim)`` each, and the position each of those holds,
        ``(batch, k_len)`` or ``(1, k_len)`` (``-1``: a slot that holds nothing). ``end`` is one
        past the furthest position any row now holds; ``contiguous=True`` promises that every
        row's new tokens sit at ``end - seq .. end - 1`` (a layer may then store them faster)."""
        ...


class LayerKVCache(nn.Module):
    """Keys and values of one attention layer: two buffers ``(batch, kv_heads, max_len, head_dim)``;
    position ``p`` of row ``b`` lives in slot ``p``."""

    window: int | None = None
    ragged_prefill = True      # rows of different lengths may be prefilled together, padded (see KVCache)

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__()
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("slot_positions", torch.arange(max_len, device=device), persistent=False)

    def write(self, name: str, positions: torch.Tensor, x: torch.Tensor, end: int | None = None) -> None:
        """Store ``x`` ``(batch, kv_heads, seq, ·)`` into buffer ``name``, row ``b``'s token ``j`` in slot
        ``positions[b, j]``; with ``end``, every row's tokens go to slots ``end - seq .. end - 1``."""
        buffer = getattr(self, name)
        if end is not None:
            buffer[:, :, end - x.shape[2]:end] = x                                 # one slice for all rows
            return
        rows = torch.arange(x.shape[0], device=x.device)[:, None]                 # (batch, 1)
        buffer[rows, :, positions] = x.transpose(1, 2).to(buffer.dtype)           # (batch, seq, kv_heads, ·)

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               end: int, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The :class:`LayerCache` contract. The keys and values returned are views of the
        buffers (no copy), slots ``0 .. end-1``: a row's slots beyond its own length hold keys of
        later positions (or nothing), which :func:`kvlib.attention.visible` hides from its queries."""
        self.write("k", positions, k, end if contiguous else None)
        self.write("v", positions, v, end if contiguous else None)
        return self.k[:, :, :end], self.v[:, :, :end], self.slot_positions[None, :end]

    def rows(self, start: int, stop: int) -> "LayerKVCache":
        """This layer's cache for rows ``start .. stop-1`` of the batch, in the same memory."""
        view = copy.copy(self)
        view._buffers = {name: buf if name == "slot_positions" else buf[start:stop]
                         for name, buf in self._buffers.items()}
        return view

    @property
    def nbytes(self) -> int:
        """Bytes of this layer's keys and values (allocated, not just used)."""
        return sum(b.nbytes for name, b in self.named_buffers() if not name.endswith("positions"))


class KVCache(nn.Module):
    """A KV cache for a whole decoder: one layer cache per layer, and how many tokens each row holds.

    ``lengths[b]`` is the number of tokens row ``b`` has stored; the decoder writes its next
    tokens at positions ``lengths[b], lengths[b] + 1, ...`` and rotates them by those positions.
    Only the cache moves the lengths: :meth:`advance` after a forward pass, :meth:`reset` and
    :meth:`truncate`. ``dtype`` is the dtype the model computes in, which is what the cache
    hands back. A subclass that stores keys and values in another form overrides :meth:`make_layer`.
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
        self.set_lengths([0] * batch)

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

    # ------------------------------------------------------------------ positions
    @property
    def pos(self) -> int:
        """How many tokens the cache holds, when every row holds the same number (one sequence:
        its length). Rows of different lengths: read :attr:`lengths`."""
        if len(set(self.lengths)) != 1:
            raise ValueError(f"the rows hold different numbers of tokens, {self.lengths}: read cache.lengths")
        return self.lengths[0]

    def positions(self, n_new: int) -> torch.Tensor:
        """Where ``n_new`` new tokens of every row go: ``(batch, n_new)``, row ``b`` at
        ``lengths[b], lengths[b] + 1, ...``."""
        start = torch.tensor(self.lengths, device=self.device)[:, None]
        return start + torch.arange(n_new, device=self.device)

    def end(self, n_new: int) -> int:
        """One past the furthest position a row holds once ``n_new`` more tokens are written."""
        return max(self.lengths) + n_new

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               end: int) -> torch.Tensor:
        """The :class:`kvlib.attention.KVStore` contract: store ``k, v`` in layer ``layer``'s cache, then attend."""
        cache = self.layers[layer]
        keys, values, key_positions = cache.update(positions, k, v, end, contiguous=self.uniform)
        return attention(q, keys, values, positions, key_positions, window=cache.window,
                         dense=self.uniform and keys.shape[2] == end)

    def set_lengths(self, lengths: Sequence[int]) -> None:
        """Set how many tokens each row holds (only the cache's own methods call this), and
        ``uniform``: whether every row holds the same number (one sequence, or rows advanced
        together). A plain bool, so that a compiled step reads it without reading the list."""
        self.lengths = [int(n) for n in lengths]
        self.uniform = self.lengths.count(self.lengths[0]) == len(self.lengths)

    @property
    def ragged_prefill(self) -> bool:
        """Whether prompts of different lengths may go in together, padded on the right. A layer
        that looks at a whole row to store it (a ring buffer keeps only the last tokens written,
        KIVI rounds whole groups) would store the padding: it takes them one row at a time."""
        return all(getattr(layer, "ragged_prefill", True) for layer in self.layers)

    def check_room(self, n_new: int | Sequence[int]) -> None:
        """Raise a clear error if ``n_new`` more tokens (per row, or for every row) would not fit."""
        news = [n_new] * self.batch if isinstance(n_new, int) else list(n_new)
        for row, (have, new) in enumerate(zip(self.lengths, news)):
            if have + new > self.max_len:
                where = "" if self.batch == 1 else f"row {row}: "
                raise ValueError(
                    f"KV cache is full: {where}it holds {have} of max_len={self.max_len} positions and cannot "
                    f"take {new} more (would need {have + new}). Build a larger cache "
                    f"(KVCache.for_model(model, max_len=...)) or call reset().")

    def advance(self, n_new: int | Sequence[int]) -> None:
        """Count ``n_new`` more stored tokens, for every row or one count per row (the decoder
        calls this after writing them)."""
        self.check_room(n_new)
        news = [n_new] * self.batch if isinstance(n_new, int) else list(n_new)
        self.set_lengths([have + int(new) for have, new in zip(self.lengths, news)])

    def reset(self) -> None:
        """Forget every stored token (the buffers are kept and simply overwritten later)."""
        self.set_lengths([0] * self.batch)

    def truncate(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` stored tokens of every row: the next write goes to
        position ``n_tokens`` (to run the same step again, or to take back rejected tokens)."""
        non_negative_int("n_tokens", n_tokens)
        if n_tokens > min(self.lengths):
            raise ValueError(f"cannot truncate to {n_tokens} tokens: the cache holds only {min(self.lengths)}")
        self.set_lengths([n_tokens] * self.batch)

    def rows(self, start: int, stop: int) -> "KVCache":
        """This cache for rows ``start .. stop-1`` of the batch, in the same memory: a smaller
        cache whose writes land here, with those rows' lengths, which then move on their own."""
        if not 0 <= start < stop <= self.batch:
            raise ValueError(f"rows {start}..{stop - 1} are not rows of a batch of {self.batch}")
        view = copy.copy(self)
        view._modules = dict(self._modules)
        view.layers = nn.ModuleList(layer.rows(start, stop) for layer in self.layers)
        view.batch = stop - start
        view.set_lengths(self.lengths[start:stop])
        return view

    def tiled(self, batch: int, room: int = 0) -> "KVCache":
        """A new cache of ``batch`` rows that each hold what row 0 of this one holds, with ``room``
        positions to spare: rows that share a prompt, prefilled once. A plain :class:`KVCache` only."""
        if type(self) is not KVCache:
            raise TypeError(f"tiled() copies a plain KVCache; a {type(self).__name__} stores its keys its own way")
        positive_int("batch", batch)
        non_negative_int("room", room)
        n, first = self.lengths[0], self.layers[0].k                    # (batch, kv_heads, max_len, head_dim)
        out = KVCache(len(self.layers), batch, first.shape[1], n + room, first.shape[3], self.dtype, self.device)
        for mine, theirs in zip(out.layers, self.layers):
            for name in ("k", "v"):
                row = getattr(theirs, name)[:1, :, :n]                   # (1, kv_heads, n, head_dim)
                mine.write(name, None, row.expand(batch, -1, -1, -1), end=n)
        out.advance(n)
        return out

    # ------------------------------------------------------------------ description
    @property
    def dtype(self) -> torch.dtype:
        """The dtype the cache hands keys and values back in (what the model computes in)."""
        return self._dtype

    @property
    def device(self) -> torch.device:
        return next(self.layers[0].buffers()).device

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's keys and values (allocated, not just used)."""
        return sum(layer.nbytes for layer in self.layers)

    def extra_repr_fields(self) -> str:
        """What :meth:`__repr__` shows beside the shape; a subclass adds its own options."""
        return ""

    def __repr__(self) -> str:
        k = self.layers[0].k
        extra = self.extra_repr_fields()
        held = f"pos={self.lengths[0]}" if self.uniform else f"lengths={self.lengths}"
        return (f"{type(self).__name__}(layers={len(self.layers)}, {extra + ', ' if extra else ''}"
                f"shape per buffer={tuple(k.shape)}, stored as {k.dtype}, returns {self.dtype}, {held}, "
                f"{self.nbytes / 2**20:.2f} MiB)")
