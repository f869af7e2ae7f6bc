"""A KV cache stored in 8-bit integers: a quarter of float32's memory, a little rounding error.

Each stored key or value vector (one token, one head: ``head_dim`` numbers) is scaled so
that its largest magnitude maps to 127, rounded to an integer in ``-127 .. 127`` and kept
as ``int8``, with its scale kept beside it (one float per vector: *per-token* scales).
Reading multiplies back (*dequantizes*), so attention computes in float as before; each
number is off by at most half its vector's scale.
"""
from __future__ import annotations

import torch

from ..checks import non_negative_int, positive_int
from .base import KVCache, LayerCache, LayerKVCache

__all__ = ["quantize_int8", "dequantize_int8", "Int8LayerKVCache", "Int8KVCache", "HalfLayerKVCache", "HalfKVCache",
           "KiviLayerKVCache", "KiviKVCache"]


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-vector symmetric int8 quantization over the last dimension.

    Returns ``(q, scale)``: ``q`` int8 of ``x``'s shape, ``scale`` float of shape
    ``(..., 1)`` with ``scale = max|x| / 127`` for each vector, so ``q * scale ≈ x`` with
    ``|x - q * scale| <= scale / 2``. An all-zero vector gets scale 0 and stays zero.
    """
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(x / safe).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` in ``dtype``: the numbers :func:`quantize_int8` stood for."""
    return q.to(dtype) * scale.to(dtype)


class Int8LayerKVCache(LayerKVCache):
    """Keys and values of one layer as int8 ``(batch, kv_heads, max_len, head_dim)``, plus one
    scale per stored vector ``(batch, kv_heads, max_len, 1)``.

    Keeps the :class:`~kvlib.cache.LayerCache` contract; ``update`` returns dequantized copies
    (in ``out_dtype``) of everything stored so far, the new tokens included.
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 out_dtype: torch.dtype, device: torch.device | str | None,
                 scale_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(batch, n_kv_heads, max_len, head_dim, torch.int8, device)
        self.out_dtype = out_dtype
        for name in ("k_scale", "v_scale"):
            self.register_buffer(name, torch.zeros(batch, n_kv_heads, max_len, 1, dtype=scale_dtype, device=device),
                                 persistent=False)

    def update(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = pos + k.shape[2]
        for name, x in (("k", k), ("v", v)):
            q, scale = quantize_int8(x)
            getattr(self, name)[:, :, pos:end] = q
            getattr(self, f"{name}_scale")[:, :, pos:end] = scale
        return (dequantize_int8(self.k[:, :, :end], self.k_scale[:, :, :end], self.out_dtype),
                dequantize_int8(self.v[:, :, :end], self.v_scale[:, :, :end], self.out_dtype))


class Int8KVCache(KVCache):
    """A KV cache that stores keys and values as int8 with per-token scales and hands them
    back dequantized to ``dtype`` (the model's dtype, float32 by default).

    A drop-in for :class:`kvlib.KVCache` (``kvlib.generate(..., cache=Int8KVCache.for_model(model))``);
    ``nbytes`` counts the int8 numbers and the scales.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 scale_dtype: torch.dtype = torch.float32) -> None:
        self.scale_dtype = scale_dtype
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim, dtype, device)

    def make_layer(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device | str | None) -> LayerCache:
        return Int8LayerKVCache(batch, n_kv_heads, max_len, head_dim, dtype, device, self.scale_dtype)

    def extra_repr_fields(self) -> str:
        return f"{self.scale_dtype} scales"


# =======================================================================================
# 16-bit storage: half of float32's bytes, the format models are usually served in
# =======================================================================================

class HalfLayerKVCache(LayerKVCache):
    """:class:`kvlib.LayerKVCache` whose buffers hold 16-bit numbers (``storage``) while the
    model computes in ``out_dtype``: keys and values are rounded once when written, and
    ``update`` hands everything stored back converted to ``out_dtype``."""

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, storage: torch.dtype,
                 out_dtype: torch.dtype, device: torch.device | str | None) -> None:
        super().__init__(batch, n_kv_heads, max_len, head_dim, storage, device)
        self.out_dtype = out_dtype

    def update(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k_all, v_all = super().update(pos, k, v)          # the buffers round k, v to `storage` on assignment
        return k_all.to(self.out_dtype), v_all.to(self.out_dtype)


class HalfKVCache(KVCache):
    """A KV cache stored in 16 bits (``storage``: ``torch.bfloat16``, the default, or
    ``torch.float16``) for a model that computes in ``dtype`` (float32 by default).

    A drop-in for :class:`kvlib.KVCache` beside a float32 model: half the bytes, each number
    rounded once to 16 bits.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 storage: torch.dtype = torch.bfloat16) -> None:
        if storage not in (torch.float16, torch.bfloat16):
            raise ValueError(f"HalfKVCache: storage must be torch.float16 or torch.bfloat16, got {storage}")
        self.storage = storage
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim, dtype, device)

    def make_layer(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device | str | None) -> LayerCache:
        return HalfLayerKVCache(batch, n_kv_heads, max_len, head_dim, self.storage, dtype, device)


# =======================================================================================
# KIVI: keys quantized per channel, values per token, the most recent tokens kept exact
# =======================================================================================

def _fake_quantize(x: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """``x`` rounded to ``bits``-bit asymmetric integers (min..max) along ``dim`` and back."""
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    steps = 2 ** bits - 1
    scale = ((hi - lo) / steps).clamp(min=1e-8)
    return torch.round((x - lo) / scale).clamp(0, steps) * scale + lo


class KiviLayerKVCache(LayerKVCache):
    """One layer of :class:`KiviKVCache`: stores exact keys and values and hands back what a
    KIVI cache would hold, keys rounded per channel and values per token, except the last
    ``recent`` positions, kept exact."""

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str | None, bits: int, recent: int) -> None:
        super().__init__(batch, n_kv_heads, max_len, head_dim, dtype, device)
        self.bits, self.recent = bits, recent

    def update(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k_all, v_all = super().update(pos, k, v)                      # (batch, kv_heads, end, head_dim)
        old = max(0, k_all.shape[2] - self.recent)                    # the positions stored rounded
        if old == 0:
            return k_all, v_all
        keys = torch.cat([_fake_quantize(k_all[:, :, :old], self.bits, dim=2), k_all[:, :, old:]], dim=2)
        values = torch.cat([_fake_quantize(v_all[:, :, :old], self.bits, dim=3), v_all[:, :, old:]], dim=2)
        return keys, values


class KiviKVCache(KVCache):
    """A KV cache as KIVI stores it (Liu et al., 2024): keys quantized *per channel* (each
    channel's range over the stored tokens: keys have a few channels of much larger values),
    values *per token*, to ``bits`` bits, with the last ``recent`` tokens kept in full precision.

    A simulation for measuring the error: it keeps exact copies and rounds what it hands back
    (over all stored tokens at once; KIVI groups tokens, and rounds each group once). The
    memory of the real format is ``bits`` per number plus a scale and a zero per channel (keys)
    or per token (values), plus the exact window: :meth:`format_bytes` counts it.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 bits: int = 4, recent: int = 0) -> None:
        self.bits, self.recent = positive_int("KiviKVCache: bits", bits), non_negative_int("KiviKVCache: recent", recent)
        self.shape = (n_layers, batch, n_kv_heads, head_dim)
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim, dtype, device)

    def make_layer(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device | str | None) -> LayerCache:
        return KiviLayerKVCache(batch, n_kv_heads, max_len, head_dim, dtype, device, self.bits, self.recent)

    def format_bytes(self, tokens: int, scale_bytes: int = 2) -> int:
        """Bytes the format itself needs for ``tokens`` stored tokens: rounded numbers at ``bits``
        bits, a scale and a zero per key channel and per value token, the exact window in 16 bits."""
        n_layers, batch, heads, head_dim = self.shape
        exact = min(tokens, self.recent)
        rounded = tokens - exact
        per_head = (2 * rounded * head_dim * self.bits / 8                  # keys and values
                    + 2 * scale_bytes * (head_dim + rounded)                # key channels, value tokens
                    + 2 * exact * head_dim * 2)                             # the window, 16-bit
        return int(n_layers * batch * heads * per_head)

    def extra_repr_fields(self) -> str:
        return f"{self.bits}-bit keys per channel and values per token, last {self.recent} exact"
