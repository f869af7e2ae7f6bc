"""Measuring what quantization does to a model's predictions over a text.

Over every position of a text, the quantized model's distribution of the next token is set
against the reference model's: the KL divergence ``KL(reference || model)`` (mean, and its
99th percentile, the bad positions), the share of positions whose most likely token is the
same (top-1 agreement), and both models' perplexity on the text itself. The text is fed
through each model's KV cache in windows, so only one window of logits is alive at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..cache.base import KVCache
from ..checks import positive_int
from ..measure.quality import Agreement, LogProbs

__all__ = ["Quality", "evaluate", "evaluate_many"]


@dataclass
class Quality(Agreement):
    """What :func:`evaluate` measured, over ``positions`` predictions: ``kl`` and ``same_top1``
    against the reference (:class:`kvlib.measure.quality.Agreement`), and both models' losses."""

    nll_reference: torch.Tensor  # (positions - 1,) float64: -log p(next token) under each model
    nll: torch.Tensor

    @property
    def ppl_reference(self) -> float:
        return math.exp(float(self.nll_reference.mean()))

    @property
    def ppl(self) -> float:
        return math.exp(float(self.nll.mean()))


@torch.no_grad()
def evaluate(reference: torch.nn.Module, model: torch.nn.Module, ids: Sequence[int] | torch.Tensor, *,
             window: int = 512, progress: bool = False) -> Quality:
    """Compare ``model``'s next-token predictions with ``reference``'s at every position of ``ids``
    (a 1-D sequence of token ids, at most the models' ``max_seq_len``), ``window`` tokens at a time."""
    return evaluate_many(reference, {"model": model}, ids, window=window, progress=progress)["model"]


@torch.no_grad()
def evaluate_many(reference: torch.nn.Module, models: dict[str, torch.nn.Module], ids: Sequence[int] | torch.Tensor, *,
                  window: int = 512, progress: bool = False) -> dict[str, Quality]:
    """:func:`evaluate` for several models against one reference, which runs once."""
    positive_int("window", window)
    ids = torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids, dtype=torch.long)
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be one text of at least 2 token ids, got shape {tuple(ids.shape)}")
    everyone = {"reference": reference, **models}
    for m in everyone.values():
        if ids.numel() > m.config.max_seq_len:
            raise ValueError(f"the text has {ids.numel()} tokens, more than the model's max_seq_len="
                             f"{m.config.max_seq_len}; evaluate a shorter piece")
    caches = {name: KVCache.for_model(m, max_len=ids.numel()) for name, m in everyone.items()}
    parts: dict[str, list[list[torch.Tensor]]] = {name: [[], [], [], []] for name in models}
    starts = range(0, ids.numel(), window)
    if progress:
        from tqdm.auto import tqdm
        starts = tqdm(starts, desc="windows of the text", unit="window")
    for start in starts:
        part = ids[start:start + window]
        targets = ids[start + 1:start + 1 + window]                  # the token each position predicts
        ref = LogProbs(reference(part[None].to(reference.device), caches["reference"])[0].cpu())  # (window, vocab)
        ref_nll = ref.nll(targets)
        for name, m in models.items():
            got = LogProbs(m(part[None].to(m.device), caches[name])[0].cpu())
            kl, same = ref.agreement(got)
            for bucket, value in zip(parts[name], (kl, same, ref_nll, got.nll(targets))):
                bucket.append(value)
    return {name: Quality(*(torch.cat(b) for b in buckets)) for name, buckets in parts.items()}
