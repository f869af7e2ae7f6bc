"""Batched decode throughput for the benchmark: several sequences decoded together.

As llama.cpp's ``llama-batched-bench`` does: ``batch`` prompts of ``prompt_len`` tokens each
(distinct pieces of the evaluation text, so that no prefix is shared), prefilled, then
``n_new`` greedy tokens for every sequence, one token per sequence per step. Throughput is
the new tokens of every sequence over the time of the one-token steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..generate import generate_batch

__all__ = ["BATCH_SIZES", "BatchedRow", "batch_prompts", "time_kvlib_batched", "time_peer_batched"]

BATCH_SIZES = (1, 8, 32)


@dataclass
class BatchedRow:
    """One implementation at one batch size."""

    name: str
    batch: int
    prefill_seconds: float
    step_seconds: list[float]          # the one-token steps (every sequence one token each)
    tokens: list[list[int]]

    @property
    def decode_tokens_per_s(self) -> float:
        return self.batch * len(self.step_seconds) / sum(self.step_seconds)

    def as_dict(self) -> dict:
        return {"name": self.name, "batch": self.batch, "prefill_seconds": self.prefill_seconds,
                "decode_tokens_per_s": self.decode_tokens_per_s}


def batch_prompts(ids: Sequence[int], batch: int, prompt_len: int = 128) -> list[list[int]]:
    """``batch`` prompts of ``prompt_len`` tokens: consecutive, non-overlapping pieces of ``ids``."""
    if batch * prompt_len > len(ids):
        raise ValueError(f"{batch} prompts of {prompt_len} tokens need {batch * prompt_len} ids, "
                         f"the text has {len(ids)}")
    return [list(ids[i * prompt_len:(i + 1) * prompt_len]) for i in range(batch)]


@torch.no_grad()
def time_kvlib_batched(name: str, model: torch.nn.Module, prompts: list[list[int]], n_new: int,
                       compile: bool = False) -> BatchedRow:
    """kvlib's :func:`kvlib.serve.generate_batch` (prompts of one length: no padding), warmed up
    first (which compiles, with ``compile=True``)."""
    generate_batch(model, prompts, 2, compile=compile)
    out = generate_batch(model, prompts, n_new, compile=compile)
    records = out[0].records                            # one record per step of the whole batch
    return BatchedRow(name, len(prompts), records[0].seconds, [r.seconds for r in records[1:]], [g.tokens for g in out])


def time_peer_batched(llm: Any, prompts: list[list[int]], n_new: int,
                      run: Callable[..., Any] | None = None) -> BatchedRow:
    """llama.cpp's batch API (:func:`kvlib.bench.peer.batched_greedy_run`, or ``run``), warmed up first."""
    from .peer import batched_greedy_run

    run = run or batched_greedy_run
    run(llm, prompts, 2)
    out = run(llm, prompts, n_new)
    return BatchedRow("llama.cpp", len(prompts), out.prefill_seconds, out.step_seconds, out.tokens)
