"""Generating for several prompts at once: one batch, left-padded, one weight read per step.

Prompts of different lengths are padded on the left to the longest one, so that every
row's *last* prompt token sits in the same slot and each step appends every row's next
token in the same slot too. The padding is masked, and each row counts its positions from
its own first real token (``left_pad``), so a row computes what it would alone, up to the
rounding of kernels that see another number of rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..cache.base import KVCache
from ..checks import non_negative_int
from ..clock import Stopwatch
from ..generate import check_sampling, sample

__all__ = ["BatchStepRecord", "BatchGeneration", "check_prompts", "generate_batch"]


@dataclass
class BatchStepRecord:
    """One step of a batched generation."""

    step: int            # 0 is the prefill of every prompt
    batch: int           # rows still generating at this step
    tokens_in: int       # tokens fed through the model this step, padding included
    seconds: float


@dataclass
class BatchGeneration:
    """What :func:`generate_batch` hands back with ``return_records=True``."""

    tokens: list[list[int]]
    logits: list[torch.Tensor]              # per prompt: (n_i, vocab) float32 on the CPU
    records: list[BatchStepRecord] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.records)


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int, max_seq_len: int, max_new_tokens: int | Sequence[int],
                  stop_token: int | None = None) -> list[list[int]]:
    """The prompts as lists of ints, or a ``TypeError``/``ValueError`` naming the prompt at fault:
    no prompts, an empty prompt, an id outside the vocabulary, or a prompt that with its new
    tokens would not fit the model (nothing is cut short silently)."""
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("no prompts: give at least one list of token ids")
    news = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    out = []
    for i, (prompt, n_new) in enumerate(zip(prompts, news)):
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if not ids:
            raise ValueError(f"prompt {i} is empty: the model needs at least one token to continue from")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise TypeError(f"prompt {i} must hold int token ids, got {ids[:5]}")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} holds token id {bad[0]}, outside the vocabulary 0..{vocab_size - 1}")
        if len(ids) + n_new > max_seq_len:
            raise ValueError(f"prompt {i}: {len(ids)} tokens + {n_new} new tokens = {len(ids) + n_new} exceeds "
                             f"the model's max_seq_len={max_seq_len}; shorten the prompt or ask for fewer tokens")
        out.append(ids)
    if stop_token is not None and not (isinstance(stop_token, int) and 0 <= stop_token < vocab_size):
        raise ValueError(f"stop_token must be a token id in 0..{vocab_size - 1}, got {stop_token!r}")
    return out


@torch.no_grad()
def generate_batch(model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                   stop_token: int | None = None, temperature: float = 0.0, top_k: int | None = None,
                   generator: torch.Generator | None = None, progress: bool = False,
                   return_records: bool = False) -> list[list[int]] | BatchGeneration:
    """Continue every prompt of ``prompts`` (token-id lists of any lengths) together, one batch.

    Returns one list of new ids per prompt, in order, each ending at its own ``stop_token``
    (included) or after ``max_new_tokens``; with ``return_records=True`` a
    :class:`BatchGeneration` that also holds each prompt's logits and one record per step.

    The prompts are left-padded to the longest and prefilled in one pass; every later step
    feeds one token per row. A row that has stopped keeps its slot until every row has
    stopped (a static batch). Tokens are chosen by :func:`kvlib.sample` (greedy by default).
    With one prompt, or prompts of one length, no padding is needed and each step runs the
    same fast path as :func:`kvlib.generate`.
    """
    non_negative_int("max_new_tokens", max_new_tokens)
    check_sampling(temperature, top_k)
    cfg = model.config
    rows = check_prompts(prompts, cfg.vocab_size, cfg.max_seq_len, max_new_tokens, stop_token)
    device = next(model.parameters()).device
    width = max(len(r) for r in rows)
    pads = [width - len(r) for r in rows]
    ids = torch.tensor([[0] * p + r for p, r in zip(pads, rows)], dtype=torch.long, device=device)   # (batch, width)
    left_pad = torch.tensor(pads, device=device) if any(pads) else None
    cache = KVCache.for_model(model, batch=len(rows), max_len=width + max_new_tokens)
    tokens: list[list[int]] = [[] for _ in rows]
    logits_of: list[list[torch.Tensor]] = [[] for _ in rows]
    records: list[BatchStepRecord] = []
    running = [True] * len(rows)
    feed = ids
    steps = range(max_new_tokens)
    if progress:
        from tqdm.auto import tqdm
        steps = tqdm(steps, desc=f"batch of {len(rows)}", unit="step")
    for step in steps:
        with Stopwatch(device) as watch:
            logits = model(feed, cache, last_only=True, left_pad=left_pad)[:, -1]      # (batch, vocab)
            chosen = sample(logits, temperature, top_k, generator)                     # (batch,)
        records.append(BatchStepRecord(step, batch=sum(running), tokens_in=feed.numel(), seconds=watch.seconds))
        for row, token in enumerate(chosen.tolist()):
            if running[row]:
                tokens[row].append(token)
                if return_records:
                    logits_of[row].append(logits[row].float().cpu())
                running[row] = token != stop_token
        if not any(running):
            break
        feed = chosen[:, None]                                                          # (batch, 1)
    if progress:
        steps.close()
    if not return_records:
        return tokens
    vocab = cfg.vocab_size
    return BatchGeneration(tokens, [torch.stack(l) if l else torch.empty(0, vocab) for l in logits_of], records)
