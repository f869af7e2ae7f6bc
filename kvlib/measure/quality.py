"""How far one model's (or one cache's) next-token predictions are from another's: position by
position (:class:`LogProbs`), and over a whole text fed through both (:func:`teacher_forced`, and
:func:`evaluate_many` and :func:`cache_quality` on it)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..cache.base import KVCache
from ..checks import positive_int
from ..device import return_freed_memory

__all__ = ["Agreement", "LogProbs", "next_token_agreement", "top2_gap", "closest_call", "Quality", "teacher_forced", "plain_cache", "evaluate",
           "evaluate_many", "cache_quality"]


@dataclass
class Agreement:
    """Next-token predictions set against a reference's, position by position, over a text."""

    kl: torch.Tensor          # (positions,) float64: KL(reference || these predictions) per position, in nats
    same_top1: torch.Tensor   # (positions,) bool: the same most likely next token

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def kl_p99(self) -> float:
        """The 99th percentile of the per-position KL: how bad the worst positions get."""
        return float(torch.quantile(self.kl, 0.99))

    @property
    def top1(self) -> float:
        """Share of positions whose most likely next token is the reference's."""
        return float(self.same_top1.double().mean())


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """Per position, the best logit minus the second best: ``(..., vocab) -> (...)``. Where it is
    smaller than two runs' rounding differences, either token may win (a near-tie)."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def closest_call(model: torch.nn.Module, prompt: Sequence[int], tokens: Sequence[int]) -> float:
    """The smallest :func:`top2_gap` over the steps that chose ``tokens`` after ``prompt``: how close
    a greedy run came to a near-tie. One forward pass over ``prompt + tokens[:-1]`` (the logits of
    each step, as a teacher-forced run computes them), so a comparison of two runs' tokens can print
    it beside its verdict."""
    if not prompt or not tokens:
        raise ValueError(f"closest_call needs a prompt and at least one token, got {len(prompt)} and {len(tokens)}")
    ids = torch.tensor([list(prompt) + list(tokens[:-1])], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids)[0, len(prompt) - 1:]                   # (len(tokens), vocab)
    return float(top2_gap(logits.float()).min())


class LogProbs:
    """Logits of shape ``(..., vocab)`` as float64 log-probabilities, computed once, so that one
    reference can be set against several models without repeating its softmax over the vocabulary."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.shape = logits.shape
        self.log_p = torch.log_softmax(logits.double(), dim=-1)
        self.top1 = logits.argmax(dim=-1)
        self._p: torch.Tensor | None = None

    @property
    def p(self) -> torch.Tensor:
        """The probabilities, computed on first use and kept."""
        if self._p is None:
            self._p = self.log_p.exp()
        return self._p

    def nll(self, targets: torch.Tensor) -> torch.Tensor:
        """``-log p(target)`` at the first ``len(targets)`` positions (of a ``(positions, vocab)`` input)."""
        return -self.log_p[:len(targets)].gather(-1, targets[:, None].to(self.log_p.device))[:, 0]

    def agreement(self, other: "LogProbs") -> tuple[torch.Tensor, torch.Tensor]:
        """``(kl, same_top1)`` with this as the reference: see :func:`next_token_agreement`."""
        if self.shape != other.shape:
            raise ValueError(f"logits of different shapes: {tuple(self.shape)} and {tuple(other.shape)}")
        kl = (self.p * (self.log_p - other.log_p)).sum(dim=-1)
        return kl, self.top1 == other.top1


def next_token_agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How far ``other``'s next-token predictions are from ``reference``'s, position by position.

    Both are logits of shape ``(..., vocab)``. Returns ``(kl, same_top1)`` of shape ``(...)``:
    the KL divergence ``KL(p_reference || p_other)`` of the two softmax distributions in nats
    (computed in float64, so it is not itself a rounding artefact), and whether the two agree
    on the most likely token.
    """
    if reference.shape != other.shape:
        raise ValueError(f"logits of different shapes: {tuple(reference.shape)} and {tuple(other.shape)}")
    return LogProbs(reference).agreement(LogProbs(other))


# ---------------------------------------------------------------------------------------
# The one teacher-forced comparison: a text through a reference and through each candidate
# ---------------------------------------------------------------------------------------

@dataclass
class Quality(Agreement):
    """Next-token predictions of one candidate (a model, or a model with another cache) against a
    reference's, over ``positions`` positions of a text: ``kl`` and ``same_top1``
    (:class:`Agreement`), both runs' losses, and the bytes of the candidate's cache."""

    nll_reference: torch.Tensor  # (positions - 1,) float64: -log p(next token) under each run
    nll: torch.Tensor
    cache_bytes: int = 0

    @property
    def ppl_reference(self) -> float:
        return math.exp(float(self.nll_reference.mean()))

    @property
    def ppl(self) -> float:
        return math.exp(float(self.nll.mean()))


Run = tuple[torch.nn.Module, Callable[[int], KVCache]]     # a model, and how to build its cache for n positions


@torch.no_grad()
def teacher_forced(reference: Run, candidates: dict[str, Run], ids: Sequence[int] | torch.Tensor, *,
                   window: int = 512, progress: str | None = None) -> dict[str, Quality]:
    """Feed the text ``ids`` through the reference and each candidate, ``window`` tokens at a time
    through each one's KV cache (*teacher forcing*: every position gets the logits a decode step
    would, attending to the stored, possibly rounded, keys and values of all earlier tokens), and
    set each candidate's next-token distributions against the reference's at every position. The
    reference runs once; only one window of the reference's logits and of one candidate's is alive at a
    time. ``progress``: a tqdm label."""
    positive_int("window", window)
    ids = torch.as_tensor(list(ids) if not isinstance(ids, torch.Tensor) else ids, dtype=torch.long).cpu()
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be one text of at least 2 token ids, got shape {tuple(ids.shape)}")
    runs = {"reference": reference, **candidates}
    for model, _ in runs.values():
        if ids.numel() > model.config.max_seq_len:
            raise ValueError(f"the text has {ids.numel()} tokens, more than the model's max_seq_len="
                             f"{model.config.max_seq_len}; evaluate a shorter piece")
    caches = {name: make(ids.numel()) for name, (_, make) in runs.items()}
    parts: dict[str, list[list[torch.Tensor]]] = {name: [[], [], [], []] for name in candidates}
    for start in _windows(ids.numel(), window, progress):
        part, targets = ids[start:start + window], ids[start + 1:start + 1 + window]
        ref = reference[0](part[None].to(reference[0].device), caches["reference"])[0].cpu()     # (window, vocab)
        for name, (model, _) in candidates.items():                  # one candidate's logits alive at a time
            got = model(part[None].to(model.device), caches[name])[0].cpu()
            for bucket, value in zip(parts[name], _compare(ref, got, targets)):
                bucket.append(value)
        return_freed_memory()        # the window's temporaries: freed, but between small results kept
    return {name: Quality(*(torch.cat(b) for b in buckets), cache_bytes=caches[name].nbytes)
            for name, buckets in parts.items()}


COMPARE_ROWS = 32        # positions compared at once: their float64 log-probabilities, not a whole window's


def _compare(ref: torch.Tensor, got: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """``(kl, same_top1, nll_reference, nll)`` of one window's logits ``(window, vocab)``, computed
    :data:`COMPARE_ROWS` positions at a time (each position's float64 log-probabilities are 8 bytes
    per word of the vocabulary: a window of 1,024 positions would hold 400 MB of them per model)."""
    out: list[list[torch.Tensor]] = [[], [], [], []]
    for i in range(0, ref.shape[0], COMPARE_ROWS):
        r, g, t = LogProbs(ref[i:i + COMPARE_ROWS]), LogProbs(got[i:i + COMPARE_ROWS]), targets[i:i + COMPARE_ROWS]
        for bucket, value in zip(out, (*r.agreement(g), r.nll(t), g.nll(t))):
            bucket.append(value)
    return [torch.cat(b) for b in out]


def _windows(n: int, window: int, progress: str | None):
    starts = range(0, n, window)
    if progress is None:
        return starts
    from tqdm.auto import tqdm
    return tqdm(starts, desc=progress, unit="window")


def plain_cache(model: torch.nn.Module) -> Callable[[int], KVCache]:
    """A full-precision :class:`kvlib.KVCache` for ``model``, of ``n`` positions."""
    return lambda n: KVCache.for_model(model, max_len=n)


def evaluate_many(reference: torch.nn.Module, models: dict[str, torch.nn.Module], ids: Sequence[int] | torch.Tensor, *,
                  window: int = 512, progress: bool = False) -> dict[str, Quality]:
    """What quantizing (or any other change of the model) does to its predictions: each of
    ``models`` against ``reference`` over the text ``ids``, each with a full-precision cache: the
    KL divergence ``KL(reference || model)`` (mean, and its 99th percentile, the bad positions),
    top-1 agreement, and both models' perplexity on the text (:func:`teacher_forced`)."""
    return teacher_forced((reference, plain_cache(reference)), {name: (m, plain_cache(m)) for name, m in models.items()},
                          ids, window=window, progress="windows of the text" if progress else None)


def evaluate(reference: torch.nn.Module, model: torch.nn.Module, ids: Sequence[int] | torch.Tensor, *,
             window: int = 512, progress: bool = False) -> Quality:
    """:func:`evaluate_many` for one model."""
    return evaluate_many(reference, {"model": model}, ids, window=window, progress=progress)["model"]


def cache_quality(model: torch.nn.Module, ids: Sequence[int], caches: dict[str, Callable[[int], KVCache]], *,
                  chunk: int = 256, progress: bool = True) -> dict[str, Quality]:
    """What a cache that stores keys and values differently does to the predictions: ``model``
    with each cache of ``caches`` (name -> a function that builds it for ``n`` positions, e.g.
    ``lambda n: Int8KVCache.for_model(model, max_len=n)``) against ``model`` with a plain
    :class:`kvlib.KVCache`, fed the text ``ids`` ``chunk`` tokens at a time (:func:`teacher_forced`)."""
    return teacher_forced((model, plain_cache(model)), {name: (model, make) for name, make in caches.items()},
                          ids, window=chunk, progress="chunks of the text" if progress else None)
