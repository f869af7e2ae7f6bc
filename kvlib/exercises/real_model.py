"""Checks for the exercises of *A real model* (section 5): what the cache costs in memory.

The checks need only :class:`kvlib.Config` shapes, never the real model's weights, so they
run in milliseconds. A wrong answer that is exactly one of the usual slips (keys only,
query heads instead of key/value heads, the layers or the batch forgotten, bits instead
of bytes, ...) is named in the hint; any other wrong answer fails with the expected value.
"""
from __future__ import annotations

from typing import Callable

from ..config import Config
from ..cache.model_shapes import MODEL_SHAPES
from .framework import MULTI_HEAD, MULTI_QUERY, Case, CheckFailed, describe, run_check

__all__ = ["check_kv_cache_bytes"]

_SMOL = Config.smollm2_135m()
_LLAMA3_8B = MODEL_SHAPES["Llama-3-8B"].config       # only its shapes: 32 layers, 8 kv heads of 128


def _kv_cache_bytes(config: Config, seq_len: int, batch: int = 1, bytes_per_number: int = 4) -> int:
    """Reference for Exercise 5.1: keys and values, per layer, per key/value head, per position."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_number * seq_len * batch


def _kv_mistakes(config: Config, seq_len: int, batch: int = 1, bytes_per_number: int = 4) -> dict[str, int]:
    right = _kv_cache_bytes(config, seq_len, batch, bytes_per_number)
    c = config
    return {
        "only the keys are counted: the cache holds a key AND a value per position (the factor 2).":
            right // 2,
        "the query heads are counted. Only the key/value heads are cached: n_kv_heads × head_dim numbers "
        "per token and layer, not n_heads × head_dim = d_model (grouped-query attention shares them).":
            2 * c.n_layers * c.n_heads * c.head_dim * bytes_per_number * seq_len * batch,
        "the layers are forgotten: every layer keeps its own keys and values (× n_layers).":
            right // c.n_layers,
        "the batch is forgotten: every sequence in the batch has its own cache (× batch).":
            right // batch,
        "bytes_per_number is ignored (always 4 bytes): bfloat16 and float16 take 2 bytes a number.":
            2 * c.n_layers * c.n_kv_heads * c.head_dim * 4 * seq_len * batch,
        "that is the number of numbers, not of bytes: multiply by bytes_per_number.":
            right // bytes_per_number,
        "that is bits, not bytes: a byte is 8 bits, and bytes_per_number is already in bytes.":
            right * 8,
        "the cache is sized for max_seq_len, not for the seq_len tokens asked about.":
            2 * c.n_layers * c.n_kv_heads * c.head_dim * bytes_per_number * c.max_seq_len * batch,
        "off by one: seq_len tokens take seq_len positions, not seq_len + 1.":
            right // seq_len * (seq_len + 1),
        "off by one: seq_len tokens take seq_len positions, not seq_len - 1.":
            right // seq_len * (seq_len - 1),
    }


def _diagnose(exercise: str, fn: Callable, cases: list[Case]) -> None:
    """Raise a :class:`CheckFailed` that names the slip if a wrong answer is exactly a known one."""
    if not callable(fn):
        return
    first = None                        # (i, case, got) of the first wrong case: the one reported
    suspects: list[str] | None = None   # the slips every wrong case so far agrees with
    for i, case in enumerate(cases, start=1):
        try:
            got = fn(*case.args, **case.kwargs)
        except Exception:
            break                       # run_check reports it, unless a slip is already clear
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return
        if got == case.expected:
            continue
        matching = [why for why, value in _kv_mistakes(*case.args, **case.kwargs).items()
                    if value != case.expected and got == value]
        suspects = matching if suspects is None else [w for w in suspects if w in matching]
        first = first or (i, case, got)
        if len(suspects) <= 1:          # a single slip explains every wrong case: name it (or none does)
            break
    if first and suspects:              # two slips may give the same number once; later cases tell them apart
        i, case, got = first
        raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({case.name}) is wrong: expected "
                          f"{case.expected:,} bytes, got {got:,}\n  input: {describe(case.args)}\n"
                          f"  hint: {suspects[0]}")


def check_kv_cache_bytes(fn: Callable) -> None:
    """Exercise 5.1: ``fn(config, seq_len, batch=1, bytes_per_number=4)`` is the size in bytes of
    the KV cache holding ``seq_len`` tokens for each of ``batch`` sequences."""
    # (config, seq_len) alone uses the defaults batch=1, bytes_per_number=4; else all four, in order
    specs = [
        ("SmolLM2-135M shapes, 32,768 tokens, float32", (_SMOL, 32_768)),
        ("SmolLM2-135M shapes, one token", (_SMOL, 1)),
        ("Config.tiny(), 10 tokens, batch 3, float32", (Config.tiny(), 10, 3, 4)),
        ("SmolLM2-135M shapes, 2,048 tokens, bfloat16 (2 bytes)", (_SMOL, 2048, 1, 2)),
        ("Llama-3-8B shapes, 32,768 tokens, batch 4, bfloat16", (_LLAMA3_8B, 32_768, 4, 2)),
        ("multi-head (no GQA), 7 tokens, batch 2, float16", (MULTI_HEAD, 7, 2, 2)),
        ("multi-query (1 kv head), 33 tokens, float64 (8 bytes)", (MULTI_QUERY, 33, 1, 8)),
    ]
    cases = [Case(name, args, _kv_cache_bytes(*args)) for name, args in specs]
    exercise = "Exercise 5.1"
    _diagnose(exercise, fn, cases)
    run_check(exercise, fn, cases,
              hint="2 (a key and a value) × n_layers × n_kv_heads × head_dim × bytes_per_number × seq_len "
                   "× batch; use the config's fields and every argument as given.")
