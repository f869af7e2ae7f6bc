"""Causal grouped-query self-attention, with or without a KV cache.

One rule decides which keys a query may see, written once in :func:`visible`: a query at
position ``p`` sees the keys at positions ``0 .. p`` (with a sliding window of ``W``, only
``p - W + 1 .. p``, plus the first ``sinks``). Every mask of the chapter is this rule: the causal
triangle of one sequence, a chunk after cached tokens (the triangle shifted by the offset),
rows of a batch at different lengths, a ring buffer's slots, the requests of a serving engine.
"""
from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .checks import non_negative_int, positive_int
from .config import Config
from .rope import RotaryEmbedding, Rotation, as_positions

class KVStore(Protocol):
    """What :class:`Attention` needs from a cache: :class:`kvlib.KVCache`, and the paged pool of
    :mod:`kvlib.serve`, keep this contract."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               end: int) -> torch.Tensor:
        """Store ``k, v`` ``(batch, kv_heads, seq, head_dim)`` as layer ``layer``'s, the tokens at
        ``positions`` ``(batch, seq)``, and return the attention of ``q`` ``(batch, heads, seq,
        head_dim)`` over everything stored that each query may see (:func:`visible`), same shape."""
        ...


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None = None, sinks: int = 0) -> torch.Tensor:
    """Which keys each query may see: ``(batch, 1, q_len, k_len)`` booleans.

    ``q_pos`` ``(batch, q_len)`` holds the position of each query, ``k_pos`` ``(batch, k_len)``
    (or ``(1, k_len)``) the position of each key; ``-1`` marks a slot that holds no key. A
    query at ``p`` sees a key at ``j`` when ``0 <= j <= p``, and with ``window=W`` only when
    also ``j > p - W`` or ``j < sinks`` (StreamingLLM's *attention sinks*, Xiao et al., 2023).
    """
    q = q_pos[:, :, None]                             # (batch, q_len, 1)
    k = k_pos[:, None, :]                             # (batch, 1, k_len)
    ok = (k >= 0) & (k <= q)
    if window is not None:
        ok &= (k > q - window) | (k < sinks)
    return ok[:, None]


def banded_mask(q_len: int, k_len: int, window: int, device: torch.device | str | None = None,
                sinks: int = 0) -> torch.Tensor:
    """:func:`visible` for one sequence whose last ``q_len`` of ``k_len`` positions are the
    queries: ``(q_len, k_len)`` booleans, the causal triangle cut to a band of ``window`` keys
    (plus the first ``sinks``). ``window >= k_len`` gives the plain causal mask."""
    positive_int("window", window)
    non_negative_int("sinks", sinks)
    keys = torch.arange(k_len, device=device)[None]
    return visible(keys[:, k_len - q_len:], keys, window, sinks)[0, 0]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     window: int | None = None, sinks: int = 0) -> torch.Tensor:
    """Scaled dot-product attention where query ``i`` sees keys ``0 .. offset + i``, written out.

    Shapes: ``q`` is ``(batch, heads, q_len, head_dim)``; ``k`` and ``v`` are
    ``(batch, kv_heads, k_len, head_dim)`` with ``kv_heads`` dividing ``heads`` and
    ``k_len >= q_len``. The queries are the *last* ``q_len`` positions, so the offset is
    ``k_len - q_len`` (0 without a cache; the number of cached tokens with one).
    :func:`attention` computes the same with PyTorch's fused kernel. With ``window=W`` each
    query sees only the last ``W`` keys up to itself (see :func:`banded_mask`).
    """
    q_len, k_len = q.shape[-2], k.shape[-2]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                        # (batch, heads, k_len, head_dim)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])    # (batch, heads, q_len, k_len)
    allowed = banded_mask(q_len, k_len, window or k_len, q.device, sinks)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v                            # (batch, heads, q_len, head_dim)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, *,
              window: int | None = None, sinks: int = 0, dense: bool = False,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """What each query's attention returns, ``(batch, heads, q_len, head_dim)``, by the rule of
    :func:`visible`, with PyTorch's fused kernel.

    ``q`` ``(batch, heads, q_len, head_dim)``, ``k`` and ``v`` ``(batch, kv_heads, k_len, head_dim)``.
    ``dense=True`` is a promise that every row's queries are the last ``q_len`` of its ``k_len``
    keys (one sequence, or rows of one length): the mask is then the plain causal triangle,
    which needs no tensor, and one new token needs none at all. ``mask``: ``visible(q_pos, k_pos,
    window, sinks)`` already computed (a serving step's layers all use the same one).
    """
    q_len, k_len = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if dense and window is None and q_len == 1:
        # One new token sees every key, so grouped-query attention becomes plain attention: the
        # `group` query heads that share a key/value head are `group` query rows of that head,
        # (batch, heads, 1, hd) -> (batch, kv_heads, group, hd). The decoding hot path on a CPU.
        b, kv_heads, _, hd = k.shape
        out = F.scaled_dot_product_attention(q.view(b, kv_heads, q.shape[1] // kv_heads, hd), k, v)
        return out.view(b, q.shape[1], 1, hd)
    if dense and window is None and q_len == k_len:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if mask is None:
        mask = visible(q_pos, k_pos, window, sinks)               # (batch, 1, q_len, k_len)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


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

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding | Rotation, positions: int | torch.Tensor,
                cache: KVStore | None = None, layer: int = 0, end: int = 0,
                window: int | None = None, sinks: int = 0) -> torch.Tensor:
        """``x`` ``(batch, seq, d_model)``: tokens at ``positions`` ``(batch, seq)`` (an int ``p``:
        at ``p, p + 1, ...``, see :func:`kvlib.rope.as_positions`), rotated by ``rope`` (or by the
        angles of these positions, :meth:`kvlib.rope.RotaryEmbedding.at`, looked up once per pass).

        Without a cache the tokens attend to each other (causally, or within ``window``, plus
        ``sinks``). With one, ``cache.attend`` stores their keys and values as layer ``layer``
        and attends over everything it holds (``end``: see :meth:`kvlib.KVCache.end`).
        """
        b, t, _ = x.shape
        positions = as_positions(positions, t, x.device)
        q, k, v = self.project(x)
        # (batch, seq, heads*head_dim) -> (batch, heads, seq, head_dim)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rope(q, positions), rope(k, positions)
        if cache is None:
            out = attention(q, k, v, positions, positions, window=window, sinks=sinks, dense=positions.shape[0] == 1)
        else:
            out = cache.attend(layer, q, k, v, positions, end)
        return self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))
