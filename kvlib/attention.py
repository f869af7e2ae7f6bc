"""Causal grouped-query self-attention, with or without a KV cache."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cache.base import LayerCache
from .checks import non_negative_int, positive_int
from .config import Config
from .rope import RotaryEmbedding


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int | None = None, sinks: int = 0) -> torch.Tensor:
    """Scaled dot-product attention where query ``i`` sees keys ``0 .. offset + i``.

    Shapes: ``q`` is ``(batch, heads, q_len, head_dim)``; ``k`` and ``v`` are
    ``(batch, kv_heads, k_len, head_dim)`` with ``kv_heads`` dividing ``heads`` and
    ``k_len >= q_len``. The queries are the *last* ``q_len`` positions, so the offset is
    ``k_len - q_len`` (0 without a cache; the number of cached tokens with one).
    This is the written-out version; :class:`Attention` calls PyTorch's fused kernel,
    which computes the same thing.

    With ``window=W`` (sliding-window attention) each query sees only the last ``W``
    keys up to itself, itself included: the causal triangle cut to a band (plus the first
    ``sinks`` keys, see :func:`banded_mask`).
    """
    q_len, k_len = q.shape[-2], k.shape[-2]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                        # (batch, heads, k_len, head_dim)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])    # (batch, heads, q_len, k_len)
    offset = k_len - q_len
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(diagonal=offset)
    if window is not None:
        allowed = allowed & banded_mask(q_len, k_len, window, q.device, sinks=sinks)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v                            # (batch, heads, q_len, head_dim)


def banded_mask(q_len: int, k_len: int, window: int, device: torch.device | str | None = None,
                sinks: int = 0) -> torch.Tensor:
    """``(q_len, k_len)`` booleans: query ``i`` may see key ``j`` when ``j`` is one of the last
    ``window`` positions up to and including the query's own.

    As everywhere in this module, the queries are the last ``q_len`` of the ``k_len`` key
    positions (offset ``k_len - q_len``). ``window >= k_len`` gives the plain causal mask.
    ``sinks=S`` also lets every query see the first ``S`` positions (keys ``0 .. S-1``, as long
    as they are not in its future): the *attention sinks* of StreamingLLM (Xiao et al., 2023).
    """
    positive_int("window", window)
    non_negative_int("sinks", sinks)
    ones = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    offset = k_len - q_len
    causal = ones.tril(diagonal=offset)
    band = causal & ones.triu(diagonal=offset - window + 1)
    if sinks:
        band |= causal & (torch.arange(k_len, device=device) < sinks)
    return band


def rotation_positions(slots: torch.Tensor, left_pad: torch.Tensor | None) -> torch.Tensor:
    """The position RoPE gives each row's first new token: its slot, less the padding before
    the row's first real token. Padding must not count: a token's position is how many real
    tokens come before it, whatever the batch around it."""
    return slots if left_pad is None else slots - left_pad


def row_mask(slots: torch.Tensor, q_len: int, k_len: int, left_pad: torch.Tensor | None = None,
             window: int | None = None) -> torch.Tensor:
    """The attention mask of a batch whose rows sit at different slots: ``(batch, 1, q_len, k_len)``.

    Row ``b``'s queries go to slots ``slots[b], slots[b] + 1, ...``; query ``i`` may see key
    slot ``j`` when ``j`` is at or before its own slot (causal, per row), not one of the
    row's ``left_pad[b]`` padding slots, and (with ``window``) one of the last ``window``
    slots. A padding query would then see no key at all, and a softmax over nothing but
    ``-inf`` is NaN; so each query may always see its own slot. Its output is thrown away.
    """
    key = torch.arange(k_len, device=slots.device)                                    # (k_len,)
    query = slots[:, None] + torch.arange(q_len, device=slots.device)                  # (batch, q_len)
    allowed = key <= query[..., None]                                                  # (batch, q_len, k_len)
    if left_pad is not None:
        allowed &= key >= left_pad[:, None, None]
    if window is not None:
        allowed &= key > query[..., None] - window
    allowed |= key == query[..., None]
    return allowed[:, None]


class Attention(nn.Module):
    """Multi-head attention with ``n_kv_heads`` key/value heads (grouped-query attention)."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.d_model, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.d_model, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.d_model, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.d_model, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The queries, keys and values of ``x`` ``(batch, seq, d_model)``, before they are split
        into heads: ``(batch, seq, heads*head_dim)``, then ``(batch, seq, kv_heads*head_dim)`` twice.
        (:class:`kvlib.fast.FusedAttention` computes all three with one matrix.)"""
        return self.wq(x), self.wk(x), self.wv(x)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, offset: int | torch.Tensor = 0,
                cache: LayerCache | None = None, window: int | None = None, sinks: int = 0,
                left_pad: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` is ``(batch, seq, d_model)``, the tokens that go to slots ``offset .. offset+seq-1``
        of the cache (the positions, without a cache).

        ``offset`` is an int for the whole batch, or a ``(batch,)`` tensor of one slot per row
        (rows of a batch at different lengths). ``left_pad`` (``(batch,)``, optional) says how
        many slots at the start of each row hold padding: those keys are masked, and the
        rotation counts positions from the first real token, ``slot - left_pad``.

        ``window``, or the ``window`` of the layer's cache (:class:`kvlib.cache.LayerCache`;
        a :class:`kvlib.cache.SlidingWindowKVCache` has one), restricts each query to the last
        ``window`` keys (sliding-window attention); with ``sinks=S`` (no cache) every query
        also sees the first ``S`` tokens (:func:`banded_mask`).
        """
        b, t, _ = x.shape
        q, k, v = self.project(x)
        # (batch, seq, heads*head_dim) -> (batch, heads, seq, head_dim)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        per_row = isinstance(offset, torch.Tensor) or left_pad is not None
        if per_row:
            slots = torch.as_tensor(offset, device=x.device).expand(b)                # (batch,) first slot of x
            positions = rotation_positions(slots, left_pad)                           # what RoPE rotates by
        else:
            positions = offset
        q, k = rope(q, positions), rope(k, positions)
        if cache is not None:
            k, v = cache.update(offset, k, v)      # all keys/values so far: (batch, kv_heads, offset+seq, head_dim)
            if cache.window is not None:
                window = cache.window
        if per_row:
            mask = row_mask(slots, t, k.shape[2], left_pad, window)                   # (batch, 1, seq, k_len)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv_heads != self.n_heads)
            return self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
        k_len = k.shape[2]
        if t == 1 and (window is None or k_len <= window):
            # One new token sees every stored key, so no mask is needed, and grouped-query
            # attention becomes plain attention: the `group` query heads that share a key/value
            # head are `group` query rows of that head. (b, heads, 1, hd) -> (b, kv_heads, group, hd)
            # This is the decoding hot path, and the faster way to run it on a CPU.
            group = self.n_heads // self.n_kv_heads
            out = F.scaled_dot_product_attention(q.view(b, self.n_kv_heads, group, self.head_dim), k, v)
            return self.wo(out.reshape(b, 1, self.n_heads * self.head_dim))
        if window is not None and (t > 1 or k_len > window):
            # sliding window: the causal triangle cut to a band of the last `window` keys
            mask, causal = banded_mask(t, k_len, window, x.device, sinks=sinks), False
        elif k_len == t:
            mask, causal = None, True              # no earlier tokens: the plain causal triangle
        else:                                      # a chunk after cached tokens: causal with an offset
            mask = torch.ones(t, k_len, dtype=torch.bool, device=x.device).tril(diagonal=k_len - t)
            causal = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             enable_gqa=self.n_kv_heads != self.n_heads)
        return self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
