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
from ..rounding import fake_quantize, from_grid, symmetric_scale, to_grid
from .base import KVCache, LayerCache, LayerKVCache

__all__ = ["quantize_int8", "dequantize_int8", "Int8LayerKVCache", "Int8KVCache", "HalfLayerKVCache", "HalfKVCache",
           "KiviLayerKVCache", "KiviKVCache"]


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-vector symmetric int8 quantization over the last dimension.

    Returns ``(q, scale)``: ``q`` int8 of ``x``'s shape, ``scale`` float of shape
    ``(..., 1)`` with ``scale = max|x| / 127`` for each vector, so ``q * scale ≈ x`` with
    ``|x - q * scale| <= scale / 2``. An all-zero vector gets scale 0 and stays zero.
    """
    scale = symmetric_scale(x, 8, dim=-1)
    return to_grid(x, scale, lo=-127, hi=127).to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` in ``dtype``: the numbers :func:`quantize_int8` stood for."""
    return from_grid(q.to(dtype), scale.to(dtype))


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

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               end: int, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for name, x in (("k", k), ("v", v)):
            q, scale = quantize_int8(x)
            self.write(name, positions, q, end if contiguous else None)
            self.write(f"{name}_scale", positions, scale, end if contiguous else None)
        return (dequantize_int8(self.k[:, :, :end], self.k_scale[:, :, :end], self.out_dtype),
                dequantize_int8(self.v[:, :, :end], self.v_scale[:, :, :end], self.out_dtype),
                self.slot_positions[None, :end])


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

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               end: int, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k_all, v_all, key_positions = super().update(positions, k, v, end, contiguous)   # stored rounded
        return k_all.to(self.out_dtype), v_all.to(self.out_dtype), key_positions


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
# KIVI: keys quantized per channel in groups of tokens, values per token, recent tokens exact
# =======================================================================================

class KiviLayerKVCache(LayerKVCache):
    """One layer of :class:`KiviKVCache`: stores exact keys and values and hands back what a
    KIVI cache holds: positions in whole groups of ``group`` tokens older than the last
    ``recent``, rounded (keys per channel within their group, values per token); the rest exact."""

    ragged_prefill = False

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str | None, bits: int, group: int, recent: int) -> None:
        super().__init__(batch, n_kv_heads, max_len, head_dim, dtype, device)
        self.bits, self.group, self.recent = bits, group, recent

    def update(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               end: int, contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k_all, v_all, key_positions = super().update(positions, k, v, end, contiguous)   # exact, slots 0 .. end-1
        held = positions[:, -1:] + 1                                              # (batch, 1): tokens each row holds
        boundary = (held - self.recent).clamp(min=0) // self.group * self.group  # below it: stored rounded
        rounded = (key_positions < boundary)[:, None, :, None]                    # (batch, 1, end, 1)
        b, heads, _, hd = k_all.shape
        full = end // self.group * self.group                                     # slots in whole groups
        groups = k_all[:, :, :full].reshape(b, heads, full // self.group, self.group, hd)
        keys = k_all.clone()
        keys[:, :, :full] = fake_quantize(groups, self.bits, dim=3, symmetric=False).reshape(b, heads, full, hd)
        values = fake_quantize(v_all, self.bits, dim=3, symmetric=False)
        return torch.where(rounded, keys, k_all), torch.where(rounded, values, v_all), key_positions


class KiviKVCache(KVCache):
    """A KV cache as KIVI stores it (Liu et al., 2024): keys quantized *per channel* (keys have a
    few channels of much larger values) within groups of ``group`` tokens, values *per token*,
    to ``bits`` bits; a group is rounded once it is complete and older than the last
    ``recent`` tokens, which stay in full precision with the incomplete group.

    A simulation for measuring the error: it keeps exact copies and rounds what it hands back.
    The memory of the real format is ``bits`` per number plus a scale and a minimum per key
    channel and group, and per value token, plus the exact tokens: :meth:`format_bytes`.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 bits: int = 4, group: int = 32, recent: int = 0) -> None:
        self.bits = positive_int("KiviKVCache: bits", bits)
        self.group = positive_int("KiviKVCache: group", group)
        self.recent = non_negative_int("KiviKVCache: recent", recent)
        self.shape = (n_layers, batch, n_kv_heads, head_dim)
        super().__init__(n_layers, batch, n_kv_heads, max_len, head_dim, dtype, device)

    def make_layer(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                   dtype: torch.dtype, device: torch.device | str | None) -> LayerCache:
        return KiviLayerKVCache(batch, n_kv_heads, max_len, head_dim, dtype, device, self.bits, self.group,
                                self.recent)

    def format_bytes(self, tokens: int, scale_bytes: int = 2) -> int:
        """Bytes the format itself needs for ``tokens`` stored tokens: rounded numbers at ``bits``
        bits, a scale and a minimum per key channel and group and per value token, the exact
        tokens in 16 bits."""
        n_layers, batch, heads, head_dim = self.shape
        rounded = max(0, tokens - self.recent) // self.group * self.group
        exact = tokens - rounded
        per_head = (2 * rounded * head_dim * self.bits / 8                               # keys and values
                    + 2 * scale_bytes * (head_dim * rounded // self.group + rounded)     # key groups, value tokens
                    + 2 * exact * head_dim * 2)                                          # exact, 16-bit
        return int(n_layers * batch * heads * per_head)

    def extra_repr_fields(self) -> str:
        return (f"{self.bits}-bit keys per channel in groups of {self.group} tokens and values per token, "
                f"last {self.recent} exact")
