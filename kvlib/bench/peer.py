"""llama.cpp as the benchmark's peer on a CPU: the same GGUF file, through llama-cpp-python.

The peer is optional. ``make peer`` builds the pinned ``llama-cpp-python`` from its PyPI
sdist, which vendors llama.cpp (it needs cmake and a C++ compiler; pip keeps the built
wheel). Without it, :func:`llama_cpp_missing` says so and how to add it, and the benchmark
runs without the peer's rows.

The peer is driven with the token ids of kvlib's tokenizer: the GGUF file carries the
vocabulary, so both programs read the same ids. It decodes greedily with its own KV cache,
reset before every run so that the prompt is prefilled each time.

llama.cpp's "extra buffer types" (weights repacked for its AMX and other special kernels, on by
default) are used when a short run with them survives in a child process
(:func:`extra_buffers_work`): on an Intel Xeon with AMX its AMX matrix product crashed the
process (a segmentation fault in ``ggml_backend_amx_mul_mat``, llama-cpp-python 0.3.36), and the
peer then runs without them, with its ordinary CPU kernels, and says so.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["PINNED", "PeerRun", "BatchedPeerRun", "llama_cpp_missing", "extra_buffers_work", "open_llama_cpp",
           "greedy_run", "batched_greedy_run", "first_difference"]

PINNED = "llama-cpp-python==0.3.36"


@dataclass
class PeerRun:
    """One greedy generation by the peer, timed token by token."""

    tokens: list[int]
    prefill_seconds: float       # from the call to the first token: the prompt's prefill (and one sampling)
    step_seconds: list[float]    # between one token and the next: one decode step each


@dataclass
class BatchedPeerRun:
    """Several sequences decoded together by the peer: one ``llama_decode`` call per step."""

    tokens: list[list[int]]      # per sequence, its new tokens
    prefill_seconds: float       # every prompt, and the first token of each
    step_seconds: list[float]    # one decode step each: one new token for every sequence


def llama_cpp_missing() -> str | None:
    """``None`` when llama-cpp-python can be imported; otherwise what is missing and how to add it."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return None
    return (f"llama.cpp is not installed here: `make peer` builds {PINNED} from its sdist "
            "(it needs cmake and a C++ compiler, and takes a few minutes once; pip keeps the wheel)")


def open_llama_cpp(path: str | Path, threads: int, n_ctx: int = 2048, *, flash_attn: bool = False,
                   extra_buffers: bool | None = None) -> Any:
    """The GGUF file at ``path`` in llama.cpp, with ``threads`` threads for prefill and decode alike,
    and its flash-attention kernel on or off (which is faster depends on the machine).

    ``extra_buffers``: whether llama.cpp may repack the weights for its special kernels (AMX and
    others; its default); ``None`` uses them where :func:`extra_buffers_work` says they run here."""
    from llama_cpp import Llama

    if extra_buffers is None:
        extra_buffers = extra_buffers_work(str(path), threads)
    with contextlib.nullcontext() if extra_buffers else _without_extra_buffers():
        return Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                     n_batch=512, flash_attn=flash_attn, verbose=False)


_PROBE = """
import sys
from llama_cpp import Llama
for flash in (False, True):
    llm = Llama(model_path=sys.argv[1], n_ctx=256, n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]),
                flash_attn=flash, verbose=False)
    for n, token in enumerate(llm.generate(list(range(1, 65)), top_k=1, temp=0.0, reset=True)):
        if n == 3:
            break
"""


@functools.lru_cache(maxsize=None)
def extra_buffers_work(path: str, threads: int) -> bool:
    """Whether llama.cpp, with its extra buffer types on (its default), reads ``path`` and writes a few
    tokens with ``threads`` threads without crashing: tried once per process, in a child process,
    since a crash in its native code would end this one."""
    probe = subprocess.run([sys.executable, "-c", _PROBE, path, str(threads)], capture_output=True, timeout=300)
    return probe.returncode == 0


@contextlib.contextmanager
def _without_extra_buffers():
    """``Llama(...)`` made inside loads its weights with ``use_extra_bufts`` off (llama-cpp-python
    has no argument for it: its model parameters start from ``llama_model_default_params``)."""
    import llama_cpp.llama_cpp as lc

    default = lc.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    lc.llama_model_default_params = params
    try:
        yield
    finally:
        lc.llama_model_default_params = default


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


_CHUNK = 512    # the most tokens one llama_decode call takes: longer prompts are prefilled in chunks


def batched_greedy_run(llm: Any, prompts: Sequence[Sequence[int]], n_new: int, *,
                       clock: Callable[[], float] | None = None) -> BatchedPeerRun:
    """``n_new`` greedy tokens after each of ``prompts``, all sequences in one batch, through
    llama.cpp's low-level batch API (what its ``llama-batched-bench`` measures).

    ``llm`` is a ``llama_cpp.Llama``: its weights are reused, in a context of its own with one
    sequence per prompt (each with its own positions and cache cells, ``kv_unified`` off) and
    ``llm``'s flash-attention setting.
    The prompts are prefilled in chunks of up to 512 tokens; then every step feeds one token
    per sequence, and the next tokens are the argmax of each sequence's logits.
    """
    import llama_cpp as lc

    if n_new < 1 or not prompts or not all(prompts):
        raise ValueError("batched_greedy_run needs n_new >= 1 and at least one non-empty prompt")
    clock = clock or time.perf_counter
    ctx = _batched_context(lc, llm, prompts, n_new)
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(llm.model))
    batch = lc.llama_batch_init(_CHUNK, 0, 1)
    decode = functools.partial(_decode_argmax, lc, ctx, batch, n_vocab)
    try:
        start = clock()
        last = decode([(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, t in enumerate(p)])
        stamps = [clock()]
        tokens = [[t] for t in last]
        for step in range(1, n_new):
            last = decode([(t, len(p) + step - 1, s, True) for s, (p, t) in enumerate(zip(prompts, last))])
            stamps.append(clock())
            for row, t in zip(tokens, last):
                row.append(t)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return BatchedPeerRun(tokens, stamps[0] - start, [b - a for a, b in zip(stamps, stamps[1:])])


def _batched_context(lc: Any, llm: Any, prompts: Sequence[Sequence[int]], n_new: int) -> Any:
    """A new llama.cpp context on ``llm``'s weights with one sequence per prompt, each with room for
    its prompt and ``n_new`` tokens; raises ``RuntimeError`` when llama.cpp cannot make it."""
    n_seq = len(prompts)
    params = lc.llama_context_default_params()
    # llama.cpp splits the context evenly among the sequences, in whole blocks of 256 cells
    per_sequence = -(-(max(len(p) for p in prompts) + n_new) // 256) * 256
    params.n_ctx = per_sequence * n_seq
    params.n_batch = params.n_ubatch = _CHUNK
    params.n_seq_max = n_seq
    params.kv_unified = False
    params.n_threads = params.n_threads_batch = llm.n_threads
    params.flash_attn_type = llm.context_params.flash_attn_type   # llm's setting, not llama.cpp's "auto"
    ctx = lc.llama_init_from_model(llm.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not make a context for {n_seq} sequences of {params.n_ctx} cells in all")
    return ctx


def _decode_argmax(lc: Any, ctx: Any, batch: Any, n_vocab: int,
                   entries: list[tuple[int, int, int, bool]]) -> list[int]:
    """Feed (token, position, sequence, wants logits) entries to ``ctx`` through ``batch``, in chunks
    of ``_CHUNK``; the argmax of each wanted row, in order."""
    import ctypes

    import numpy as np

    chosen = []
    for start in range(0, len(entries), _CHUNK):
        part = entries[start:start + _CHUNK]
        batch.n_tokens = len(part)
        for i, (token, pos, seq, wants) in enumerate(part):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, wants
            batch.seq_id[i][0] = seq
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed: the context has no room for this batch")
        for i, (*_, wants) in enumerate(part):
            if wants:
                row = lc.llama_get_logits_ith(ctx, i)
                chosen.append(int(np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)),
                                                        shape=(n_vocab,)).argmax()))
    return chosen


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (the shorter one's end counts), or ``None``."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))
