"""llama.cpp as the benchmark's peer on a CPU: the same GGUF file, through llama-cpp-python.

The peer is optional. ``make peer`` builds the pinned ``llama-cpp-python`` from its PyPI
sdist, which vendors llama.cpp (it needs cmake and a C++ compiler; pip keeps the built
wheel). Without it, :func:`llama_cpp_missing` says so and how to add it, and the benchmark
runs without the peer's rows.

The peer is driven with the token ids of kvlib's tokenizer: the GGUF file carries the
vocabulary, so both programs read the same ids. It decodes greedily with its own KV cache,
reset before every run so that the prompt is prefilled each time.
"""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["PINNED", "PeerRun", "llama_cpp_missing", "open_llama_cpp", "greedy_run", "first_difference"]

PINNED = "llama-cpp-python==0.3.36"


@dataclass
class PeerRun:
    """One greedy generation by the peer, timed token by token."""

    tokens: list[int]
    prefill_seconds: float       # from the call to the first token: the prompt's prefill (and one sampling)
    step_seconds: list[float]    # between one token and the next: one decode step each


def llama_cpp_missing() -> str | None:
    """``None`` when llama-cpp-python can be imported; otherwise what is missing and how to add it."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return None
    return (f"llama.cpp is not installed here: `make peer` builds {PINNED} from its sdist "
            "(it needs cmake and a C++ compiler, and takes a few minutes once; pip keeps the wheel)")


def open_llama_cpp(path: str | Path, threads: int, n_ctx: int = 2048) -> Any:
    """The GGUF file at ``path`` in llama.cpp, with ``threads`` threads for prefill and decode alike."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                 n_batch=512, verbose=False)


def greedy_run(llm: Any, prompt: Sequence[int], n_new: int, *,
               clock: Callable[[], float] | None = None) -> PeerRun:
    """``n_new`` greedy tokens after ``prompt`` (token ids), with the time of each.

    ``llm`` is a ``llama_cpp.Llama`` (or anything with its ``reset()`` and ``generate()``):
    ``generate`` yields each token once it is chosen, so the time to the first is the prefill
    and the time between two is one decode step. ``clock`` defaults to ``time.perf_counter``.
    """
    if n_new < 1:
        raise ValueError(f"n_new must be at least 1, got {n_new}")
    if not prompt:
        raise ValueError("the prompt is empty: the peer needs at least one token to start from")
    clock = clock or time.perf_counter
    llm.reset()                                    # forget the last run's cache: prefill the prompt again
    tokens: list[int] = []
    stamps: list[float] = []
    start = clock()
    for token in llm.generate(list(prompt), top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                              reset=True):
        stamps.append(clock())
        tokens.append(int(token))
        if len(tokens) == n_new:
            break
    if len(tokens) < n_new:
        raise RuntimeError(f"the peer stopped after {len(tokens)} of {n_new} tokens")
    return PeerRun(tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])])


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (the shorter one's end counts), or ``None``."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))
