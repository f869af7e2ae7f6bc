"""Generating for several prompts at once: one batch, one weight read per step.

Prompts of different lengths go into one batch padded on the right; the cache knows each
row's own length (:attr:`kvlib.KVCache.lengths`), so every row's tokens sit at their own
positions, its padding is never attended to (it sits after the row's last token, and the
row's next token overwrites it), and each row computes what it would alone, up to the
rounding of kernels that see another number of rows.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..cache.base import KVCache
from ..checks import non_negative_int
from ..generate import Generation, check_prompts, check_sampling, compiled_step, decode, deprecated_records

__all__ = ["generate_batch"]


def generate_batch(model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                   stop_token: int | None = None, temperature: float = 0.0, top_k: int | None = None,
                   generator: torch.Generator | None = None, progress: bool = False, use_cache: bool = True,
                   cache: KVCache | None = None, keep_logits: bool = False, compile: bool = False,
                   return_records: bool = False) -> list[Generation]:
    """Continue every prompt of ``prompts`` (token-id lists of any lengths) together, one batch.

    Returns one :class:`kvlib.Generation` per prompt, in order (the new ids, a ``list[int]``),
    each ending at its own ``stop_token`` (included) or after ``max_new_tokens``; they share
    ``.records`` (one per step of the batch) and, with ``keep_logits=True``, each has its own
    ``.logits``. ``cache`` may be any cache class built for ``len(prompts)`` rows
    (``Int8KVCache.for_model(model, batch=...)``, a sliding window, ...); it is reset first.

    The prompts are prefilled in one pass; every later step feeds one token per row. A row
    that has stopped keeps its place until every row has stopped (a static batch). Tokens are
    chosen by :func:`kvlib.sample` (greedy by default). ``compile=True`` runs the one-token steps
    compiled (:func:`kvlib.compiled.compiled_decode_step`, as in :func:`kvlib.generate`). This is :func:`kvlib.generate`'s loop
    (:func:`kvlib.generate.decode`) with one row per prompt.
    """
    non_negative_int("max_new_tokens", max_new_tokens)
    check_sampling(temperature, top_k)
    keep_logits = deprecated_records(return_records, keep_logits, "generate_batch")
    cfg = model.config
    rows = check_prompts(prompts, cfg.vocab_size, cfg.max_seq_len, max_new_tokens, stop_token)
    step_fn = compiled_step(model, compile, use_cache)
    label = f"batch of {len(rows)}" if progress else None
    return decode(model, rows, max_new_tokens, use_cache=use_cache, cache=cache, temperature=temperature,
                  top_k=top_k, generator=generator, stop_token=stop_token, progress=label, keep_logits=keep_logits,
                  step_fn=step_fn)
