"""Checks for the exercises of *Attention, step by step* (Exercises 2.1 and 2.2).

Each check compares a student's function with a written-out reference on seeded random
inputs. When the answer is wrong, the check also tries the usual mistakes (no scaling,
mask off by one, softmax over the wrong axis, keys and values swapped, ...) and, if the
student's result is exactly what one of them gives, names that mistake in the hint.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .framework import Case, diagnose, run_check

__all__ = ["check_one_head_causal_attention", "check_gqa_attention"]


# --- references and the usual mistakes, written out --------------------------------------

def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: bool = True,
            mask_diagonal: int | None = 1, softmax_dim: int = -1) -> torch.Tensor:
    """Causal attention on the last two dimensions; the keywords switch in the usual mistakes.

    ``mask_diagonal`` is the ``diagonal`` of ``triu`` that marks the forbidden entries:
    1 is right (query ``i`` sees keys ``0..i``), 0 also hides the token from itself,
    2 lets it see one token ahead, ``None`` masks nothing.
    """
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask_diagonal is not None:
        n, m = scores.shape[-2], scores.shape[-1]
        forbidden = torch.ones(n, m, dtype=torch.bool).triu(diagonal=mask_diagonal)
        scores = scores.masked_fill(forbidden, float("-inf"))
    return scores.softmax(dim=softmax_dim) @ v


def _one_head_causal_attention(q, k, v):
    """Reference for Exercise 2.1: ``q, k, v`` of shape ``(seq, head_dim)``."""
    return _attend(q, k, v)


def _expand_kv(k: torch.Tensor, n_heads: int, *, tiled: bool = False) -> torch.Tensor:
    """``(batch, kv_heads, seq, d) -> (batch, heads, seq, d)``: query head ``h`` reads kv head ``h // group``."""
    group = n_heads // k.shape[1]
    if tiled:                     # the mistake: head h reads kv head h % kv_heads
        return k.repeat(1, group, 1, 1)
    return k.repeat_interleave(group, dim=1)


def _gqa_attention(q, k, v, **mistake):
    """Reference for Exercise 2.2: ``q`` is ``(batch, heads, seq, d)``, ``k, v`` are ``(batch, kv_heads, seq, d)``."""
    tiled = mistake.pop("tiled", False)
    k, v = _expand_kv(k, q.shape[1], tiled=tiled), _expand_kv(v, q.shape[1], tiled=tiled)
    return _attend(q, k, v, **mistake)


# --- Exercise 2.1 ----------------------------------------------------------------------------

_HINT_ONE_HEAD = ("the usual mistakes: forgetting to divide the scores by sqrt(head_dim); masking the "
                  "diagonal too (a token must see itself: mask only key j > query i, triu(diagonal=1)); "
                  "softmax over the wrong dimension (each query's row must sum to 1: dim=-1); "
                  "using the values to score and the keys to mix (scores are q @ k.T, the output is weights @ v).")

_MISTAKES_ONE_HEAD: list[tuple[str, Callable]] = [
    ("the scores are not scaled: divide q @ k.T by sqrt(head_dim) (here sqrt of q.shape[-1]).",
     lambda q, k, v: _attend(q, k, v, scale=False)),
    ("the mask hides the diagonal too, so token 0 has nothing left to look at (NaN). A token sees "
     "itself: mask only key j > query i, i.e. triu(diagonal=1).",
     lambda q, k, v: _attend(q, k, v, mask_diagonal=0)),
    ("the mask is one step too generous: each token also sees the next one. Mask key j > query i, "
     "i.e. triu(diagonal=1) (or keep tril(diagonal=0)).",
     lambda q, k, v: _attend(q, k, v, mask_diagonal=2)),
    ("there is no causal mask: every token also sees the tokens after it. Set the scores of "
     "key j > query i to -inf before the softmax.",
     lambda q, k, v: _attend(q, k, v, mask_diagonal=None)),
    ("the softmax runs over the wrong dimension: each query's weights (a row of the score matrix) "
     "must sum to 1, so use softmax(dim=-1).",
     lambda q, k, v: _attend(q, k, v, softmax_dim=-2)),
    ("keys and values are swapped: score with the keys (q @ k.T) and take the weighted sum of the values.",
     lambda q, k, v: _attend(q, v, k)),
]


def _qkv(seed: int, *shape: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def _one_head_cases() -> list[Case]:
    cases = []
    for name, seed, seq, d in [("5 tokens, head_dim 4", 21, 5, 4),
                               ("one token", 22, 1, 4),
                               ("12 tokens, head_dim 16", 23, 12, 16),
                               ("2 tokens, head_dim 2", 24, 2, 2)]:
        q, k, v = _qkv(seed, seq, d)
        cases.append(Case(name, (q, k, v), _one_head_causal_attention(q, k, v)))
    return cases


def check_one_head_causal_attention(fn: Callable) -> None:
    """Exercise 2.1: ``fn(q, k, v)`` for one head, ``(seq, head_dim)`` tensors, causal."""
    cases = _one_head_cases()
    hint = diagnose(fn, cases, _MISTAKES_ONE_HEAD) or _HINT_ONE_HEAD
    run_check("Exercise 2.1", fn, cases, hint=hint)


# --- Exercise 2.2 ----------------------------------------------------------------------------

_HINT_GQA = ("the usual mistakes: query head h must read key/value head h // (heads // kv_heads) "
             "(repeat_interleave on dim 1, not repeat); forgetting the 1/sqrt(head_dim) scale; a causal "
             "mask off by one (mask key j > query i only); softmax over the wrong dimension (dim=-1); "
             "keys and values swapped.")

_MISTAKES_GQA: list[tuple[str, Callable]] = [
    ("the query heads are matched to the wrong key/value heads: heads 0 and 1 share kv head 0, heads "
     "2 and 3 share kv head 1 (head h reads kv head h // group). Use k.repeat_interleave(group, dim=1), "
     "not k.repeat(1, group, 1, 1).",
     lambda q, k, v: _gqa_attention(q, k, v, tiled=True)),
    ("the scores are not scaled: divide them by sqrt(head_dim).",
     lambda q, k, v: _gqa_attention(q, k, v, scale=False)),
    ("the mask hides the diagonal too (NaN in the first position). A token sees itself: "
     "mask only key j > query i, i.e. triu(diagonal=1).",
     lambda q, k, v: _gqa_attention(q, k, v, mask_diagonal=0)),
    ("the mask is one step too generous: each token also sees the next one. Use triu(diagonal=1) "
     "for the forbidden entries.",
     lambda q, k, v: _gqa_attention(q, k, v, mask_diagonal=2)),
    ("there is no causal mask: every token also sees the tokens after it.",
     lambda q, k, v: _gqa_attention(q, k, v, mask_diagonal=None)),
    ("the softmax runs over the wrong dimension: each query's weights must sum to 1 (softmax(dim=-1)).",
     lambda q, k, v: _gqa_attention(q, k, v, softmax_dim=-2)),
    ("keys and values are swapped: score with the keys and take the weighted sum of the values.",
     lambda q, k, v: _gqa_attention(q, v, k)),
]


def _gqa_cases() -> list[Case]:
    cases = []
    for name, seed, batch, heads, kv_heads, seq, d in [
            ("batch 1, 4 query heads sharing 2 kv heads, 6 tokens", 31, 1, 4, 2, 6, 4),
            ("multi-head: 3 query heads, 3 kv heads", 32, 1, 3, 3, 5, 4),
            ("multi-query: 4 query heads, 1 kv head", 33, 1, 4, 1, 5, 8),
            ("batch 2, 6 query heads sharing 2 kv heads", 34, 2, 6, 2, 7, 4),
            ("one token, 4 query heads, 2 kv heads", 35, 2, 4, 2, 1, 4)]:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(batch, heads, seq, d, generator=g)
        k = torch.randn(batch, kv_heads, seq, d, generator=g)
        v = torch.randn(batch, kv_heads, seq, d, generator=g)
        cases.append(Case(name, (q, k, v), _gqa_attention(q, k, v)))
    return cases


def check_gqa_attention(fn: Callable) -> None:
    """Exercise 2.2: causal grouped-query attention, ``q`` ``(batch, heads, seq, d)``, ``k, v`` ``(batch, kv_heads, seq, d)``."""
    cases = _gqa_cases()
    hint = diagnose(fn, cases, _MISTAKES_GQA) or _HINT_GQA
    run_check("Exercise 2.2", fn, cases, hint=hint)
