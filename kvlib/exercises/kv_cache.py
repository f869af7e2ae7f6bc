"""Checks for the exercises of *The KV cache* (Exercises 3.1 to 3.3).

As in :mod:`kvlib.exercises.attention`, a wrong answer that is exactly one of the usual
mistakes (values and keys swapped, the new token prepended, the RoPE offset forgotten, ...)
is named in the hint.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .framework import Case, CheckFailed, check_prediction, diagnose, run_check

__all__ = ["check_cached_attention_step", "check_rope_rotate", "check_rope_rotate_qk", "check_cache_prediction"]


# --- Exercise 3.1: one cached attention step ---------------------------------------------------

def _cached_attention_step(x_new, wq, wk, wv, k_cache, v_cache, *, scale=True, swap_kv=False,
                           prepend=False, include_new=True, softmax_dim=-1, swap_returned=False):
    """Reference for Exercise 3.1 (keywords switch in the usual mistakes).

    ``x_new`` ``(1, d_model)``; ``wq, wk, wv`` ``(d_model, head_dim)``; ``k_cache, v_cache``
    ``(t, head_dim)``. Returns the new token's output ``(1, head_dim)`` and both caches grown
    to ``(t + 1, head_dim)``.
    """
    q, k, v = x_new @ wq, x_new @ wk, x_new @ wv                       # (1, head_dim) each
    grown = (lambda old, new: torch.cat([new, old])) if prepend else (lambda old, new: torch.cat([old, new]))
    k_all, v_all = grown(k_cache, k), grown(v_cache, v)                 # (t + 1, head_dim)
    keys, values = (k_all, v_all) if include_new else (k_cache, v_cache)
    if swap_kv:
        keys, values = values, keys
    scores = q @ keys.T                                                 # (1, t + 1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    out = scores.softmax(dim=softmax_dim) @ values                      # (1, head_dim)
    return (out, v_all, k_all) if swap_returned else (out, k_all, v_all)


_HINT_STEP = ("the usual mistakes: forgetting to append the new token's key and value before attending "
              "(the new token sees itself); prepending instead of appending (the cache is in position "
              "order: torch.cat([k_cache, k_new])); forgetting the 1/sqrt(head_dim) scale; swapping keys and "
              "values; returning the caches in the wrong order (out, k_cache, v_cache).")

_MISTAKES_STEP: list[tuple[str, Callable]] = [
    ("the new token's own key and value are left out of the attention. Append them first, then "
     "attend over all t + 1 rows: the new token sees itself.",
     lambda *a: _cached_attention_step(*a, include_new=False)),
    ("the new row is put in front of the cache. The cache is kept in position order: "
     "torch.cat([k_cache, k_new]) (the output is the same either way, but the next step's cache is not).",
     lambda *a: _cached_attention_step(*a, prepend=True)),
    ("the scores are not scaled: divide q @ K.T by sqrt(head_dim).",
     lambda *a: _cached_attention_step(*a, scale=False)),
    ("keys and values are swapped: the query is compared with the keys, and the values are mixed.",
     lambda *a: _cached_attention_step(*a, swap_kv=True)),
    ("the two caches come back in the wrong order: return (out, k_cache, v_cache).",
     lambda *a: _cached_attention_step(*a, swap_returned=True)),
    ("the softmax runs over the wrong dimension: the weights over the t + 1 keys must sum to 1 "
     "(scores has shape (1, t + 1): softmax(dim=-1)).",
     lambda *a: _cached_attention_step(*a, softmax_dim=0)),
]


def _step_cases() -> list[Case]:
    cases = []
    for name, seed, d_model, head_dim, t in [("first token: empty cache", 41, 8, 4, 0),
                                             ("one cached token", 42, 8, 4, 1),
                                             ("7 cached tokens", 43, 8, 4, 7),
                                             ("20 cached tokens, d_model 16, head_dim 8", 44, 16, 8, 20)]:
        g = torch.Generator().manual_seed(seed)
        x_new = torch.randn(1, d_model, generator=g)
        wq, wk, wv = (torch.randn(d_model, head_dim, generator=g) / math.sqrt(d_model) for _ in range(3))
        k_cache = torch.randn(t, head_dim, generator=g)
        v_cache = torch.randn(t, head_dim, generator=g)
        args = (x_new, wq, wk, wv, k_cache, v_cache)
        cases.append(Case(name, args, _cached_attention_step(*args)))
    return cases


def check_cached_attention_step(fn: Callable) -> None:
    """Exercise 3.1: ``fn(x_new, wq, wk, wv, k_cache, v_cache) -> (out, k_cache, v_cache)``."""
    cases = _step_cases()
    hint = diagnose(fn, cases, _MISTAKES_STEP) or _HINT_STEP
    run_check("Exercise 3.1", fn, cases, hint=hint)


# --- Exercise 3.2: RoPE with the position offset ---------------------------------------------

def _rope_rotate(x, offset, theta=10_000.0, *, positions=None, sign=1.0, interleaved=False):
    """Reference for Exercise 3.2: rotate ``x`` ``(..., seq, head_dim)`` as positions ``offset .. offset+seq-1``.

    Rotate-half convention, as :class:`kvlib.rope.RotaryEmbedding` (tables in float64).
    ``positions``, ``sign`` and ``interleaved`` switch in the usual mistakes.
    """
    seq, head_dim = x.shape[-2], x.shape[-1]
    if positions is None:
        positions = torch.arange(offset, offset + seq, dtype=torch.float64)
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(positions.to(torch.float64), inv_freq)                     # (seq, head_dim/2)
    if interleaved:                   # pairs (0, 1), (2, 3), ... instead of (i, i + head_dim/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - sign * x2 * sin, x2 * cos + sign * x1 * sin], dim=-1).flatten(-2)
    angles = torch.cat([angles, angles], dim=-1)                                     # (seq, head_dim)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + sign * torch.cat([-x2, x1], dim=-1) * sin


_HINT_ROPE = ("the usual mistakes: positions starting at 0 instead of at offset (the new tokens sit at "
              "offset, offset + 1, ...); an off-by-one offset; rotating the wrong way (x * cos + "
              "rotate_half(x) * sin, with rotate_half([x1, x2]) = [-x2, x1]); pairing neighbouring channels "
              "instead of channel i with i + head_dim/2; ignoring theta.")


def _same_position(x, offset):
    if offset == 0:               # then it is "not rotated at all", named below
        raise ValueError("not this mistake")
    return torch.full((x.shape[-2],), float(offset), dtype=torch.float64)


_MISTAKES_ROPE: list[tuple[str, Callable]] = [
    ("the position offset is forgotten: the new tokens are rotated as positions 0, 1, ... "
     "They sit at offset, offset + 1, ...: torch.arange(offset, offset + seq).",
     lambda x, offset, theta=10_000.0: _rope_rotate(x, offset, theta,
                                                    positions=torch.arange(x.shape[-2], dtype=torch.float64))),
    ("the positions are off by one: the first new token sits at position offset, not offset + 1.",
     lambda x, offset, theta=10_000.0: _rope_rotate(x, offset, theta, positions=torch.arange(
         offset + 1, offset + 1 + x.shape[-2], dtype=torch.float64))),
    ("every token of the chunk gets the same position: use offset, offset + 1, ..., offset + seq - 1.",
     lambda x, offset, theta=10_000.0: _rope_rotate(x, offset, theta, positions=_same_position(x, offset))),
    ("the rotation goes the wrong way: x * cos + rotate_half(x) * sin, with rotate_half([x1, x2]) = [-x2, x1].",
     lambda x, offset, theta=10_000.0: _rope_rotate(x, offset, theta, sign=-1.0)),
    ("neighbouring channels (0, 1), (2, 3), ... are paired; kvlib (like Llama in Hugging Face) pairs "
     "channel i with channel i + head_dim/2 (x.chunk(2, dim=-1)).",
     lambda x, offset, theta=10_000.0: _rope_rotate(x, offset, theta, interleaved=True)),
    ("theta is ignored: the frequencies are theta ** (-2i / head_dim) with the theta passed in.",
     lambda x, offset, theta=10_000.0: _rope_rotate(x, offset)),
    ("x comes back unrotated, as if every token sat at position 0: the token at position p turns each "
     "channel pair by the angle p * theta ** (-2i / head_dim), and the positions are offset, offset + 1, ...",
     lambda x, offset, theta=10_000.0: x),
]


def _rope_cases() -> list[Case]:
    cases = []
    for name, seed, shape, offset, theta in [
            ("prefill: 5 tokens at positions 0..4", 51, (1, 2, 5, 8), 0, 10_000.0),
            ("decode: one token at position 5", 52, (1, 2, 1, 8), 5, 10_000.0),
            ("a chunk of 3 tokens at positions 4..6, batch 2", 53, (2, 2, 3, 8), 4, 10_000.0),
            ("one token at position 100, theta 100000 (SmolLM2's)", 54, (1, 3, 1, 16), 100, 100_000.0)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        # atol 1e-4: a float32 angle table is fine too (at position 100 it is off by ~1e-5)
        cases.append(Case(name, (x, offset), _rope_rotate(x, offset, theta), kwargs={"theta": theta}, atol=1e-4))
    return cases


def check_rope_rotate(fn: Callable) -> None:
    """Exercise 3.2: ``fn(x, offset, theta=10_000.0)`` rotates ``x`` ``(batch, heads, seq, head_dim)``
    as positions ``offset .. offset + seq - 1``."""
    cases = _rope_cases()
    hint = diagnose(fn, cases, _MISTAKES_ROPE) or _HINT_ROPE
    run_check("Exercise 3.2", fn, cases, hint=hint)


# --- Exercise 3.2 (since issue 17): find the bug, right prefill, wrong decode ------------------

def _rope_rotate_qk(q, k, offset, theta=10_000.0, *, q_start=None, k_start=None):
    """Reference for Exercise 3.2: ``q`` and ``k`` ``(batch, heads, seq, head_dim)`` hold the new tokens at
    positions ``offset .. offset + seq - 1``; both are rotated as those positions. ``q_start`` and
    ``k_start`` (the first position each is rotated as) switch in the usual mistakes."""
    q_start = offset if q_start is None else q_start
    k_start = offset if k_start is None else k_start
    return _rope_rotate(q, q_start, theta), _rope_rotate(k, k_start, theta)


_MISTAKES_QK: list[tuple[str, Callable]] = [
    ("the queries are rotated at offset, offset + 1, ..., but the keys at 0, 1, ...: that is the colleague's "
     "bug, left in. The new keys sit at the same positions as the new queries, and the cache keeps them "
     "rotated: a key rotated at the wrong position stays wrong for every later step.",
     lambda q, k, offset, theta=10_000.0: _rope_rotate_qk(q, k, offset, theta, k_start=0)),
    ("now the keys are rotated at offset, but the queries at 0, 1, ...: both need the offset.",
     lambda q, k, offset, theta=10_000.0: _rope_rotate_qk(q, k, offset, theta, q_start=0)),
    ("neither queries nor keys get the offset: the new tokens sit at offset, offset + 1, ...",
     lambda q, k, offset, theta=10_000.0: _rope_rotate_qk(q, k, offset, theta, q_start=0, k_start=0)),
    ("the keys get the offset twice (positions 2 * offset, ...): add it once.",
     lambda q, k, offset, theta=10_000.0: _rope_rotate_qk(q, k, offset, theta, k_start=2 * offset)),
    ("the queries and keys come back in the wrong order: return (q_rotated, k_rotated).",
     lambda q, k, offset, theta=10_000.0: _rope_rotate_qk(q, k, offset, theta)[::-1]),
]

_HINT_QK = ("both the new queries and the new keys sit at positions offset, offset + 1, ...: rotate both "
            "as those positions (the prefill, offset 0, hides a key rotated at the wrong place).")


def _qk_cases() -> list[Case]:
    cases = []
    for name, seed, q_shape, k_heads, offset, theta in [
            ("prefill: 5 tokens at positions 0..4", 71, (1, 4, 5, 8), 2, 0, 10_000.0),
            ("decode: one token at position 5", 72, (1, 4, 1, 8), 2, 5, 10_000.0),
            ("a chunk of 3 tokens at positions 4..6, batch 2", 73, (2, 2, 3, 8), 2, 4, 10_000.0),
            ("one token at position 100, theta 100000 (SmolLM2's)", 74, (1, 3, 1, 16), 1, 100, 100_000.0)]:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(*q_shape, generator=g)
        k = torch.randn(q_shape[0], k_heads, q_shape[2], q_shape[3], generator=g)
        cases.append(Case(name, (q, k, offset), _rope_rotate_qk(q, k, offset, theta),
                          kwargs={"theta": theta}, atol=1e-4))
    return cases


def check_rope_rotate_qk(fn: Callable) -> None:
    """Exercise 3.2: ``fn(q, k, offset, theta=10_000.0) -> (q_rotated, k_rotated)``, both rotated as
    positions ``offset .. offset + seq - 1``."""
    cases = _qk_cases()
    hint = diagnose(fn, cases, _MISTAKES_QK) or _HINT_QK
    run_check("Exercise 3.2", fn, cases, hint=hint)


# --- Exercise 3.3: predict what the cache holds, then look -------------------------------------

_PREDICTION_KEYS = ("pos", "bytes in use", "bytes allocated", "pos after kvlib.generate")

_WHY = {
    "pos": "the prefill stores every prompt token, and each decode step one more.",
    "bytes in use": "a key and a value per layer, per key/value head and per position, head_dim numbers "
                    "of 4 bytes each; the query heads are not cached.",
    "bytes allocated": "the buffers are allocated for all max_len positions, whatever pos is.",
    "pos after kvlib.generate": "kvlib.generate(model, prompt, 5) chooses 5 tokens, but the last one is "
                                "never fed back in: the prefill chooses the first, and only 4 decode steps follow.",
}


def _measure_cache() -> dict[str, int]:
    """The experiment of Exercise 3.3, on a seeded ``Config.tiny()`` model."""
    from ..cache import KVCache
    from ..config import Config
    from ..generate import generate
    from ..model import Decoder
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Decoder(Config.tiny()).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(3))
    cache = KVCache.for_model(model, max_len=64)
    with torch.no_grad():
        model(prompt, cache)
        for token in [1, 2, 3, 4, 5]:
            model(torch.tensor([[token]]), cache)
    used = sum(layer.k[:, :, :cache.pos].nbytes + layer.v[:, :, :cache.pos].nbytes for layer in cache.layers)
    generated = KVCache.for_model(model, max_len=64)
    generate(model, prompt[0], 5, cache=generated)
    return {"pos": cache.pos, "bytes in use": used, "bytes allocated": cache.nbytes,
            "pos after kvlib.generate": generated.pos}


def check_cache_prediction(fn: Callable) -> None:
    """Exercise 3.3: ``fn()`` returns the four predictions, a dict with the keys ``"pos"``,
    ``"bytes in use"``, ``"bytes allocated"`` and ``"pos after kvlib.generate"``; the check runs the
    experiment on ``Config.tiny()`` and grades each."""
    exercise = "Exercise 3.3"
    if not callable(fn):
        raise CheckFailed(f"{exercise}: expected a function, got {type(fn).__name__}")
    try:
        predicted = fn()
    except NotImplementedError:
        raise CheckFailed(f"{exercise}: not written yet — return your four predictions.") from None
    if not isinstance(predicted, dict) or set(predicted) != set(_PREDICTION_KEYS):
        raise CheckFailed(f"{exercise}: return a dict with the keys {', '.join(map(repr, _PREDICTION_KEYS))}; "
                          f"got {predicted!r}"[:400])
    measured = _measure_cache()
    for key in _PREDICTION_KEYS:
        check_prediction(exercise, predicted[key], measured[key], rel_tol=0.01, what=repr(key), why=_WHY[key])
