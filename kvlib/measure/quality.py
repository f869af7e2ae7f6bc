"""How far one model's (or one cache's) next-token predictions are from another's."""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Agreement", "LogProbs", "next_token_agreement"]


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
