"""How far one model's (or one cache's) next-token predictions are from another's."""
from __future__ import annotations

import torch

__all__ = ["next_token_agreement"]


def next_token_agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How far ``other``'s next-token predictions are from ``reference``'s, position by position.

    Both are logits of shape ``(..., vocab)``. Returns ``(kl, same_top1)`` of shape ``(...)``:
    the KL divergence ``KL(p_reference || p_other)`` of the two softmax distributions in nats
    (computed in float64, so it is not itself a rounding artefact), and whether the two agree
    on the most likely token.
    """
    if reference.shape != other.shape:
        raise ValueError(f"logits of different shapes: {tuple(reference.shape)} and {tuple(other.shape)}")
    ref = torch.log_softmax(reference.double(), dim=-1)
    oth = torch.log_softmax(other.double(), dim=-1)
    kl = (ref.exp() * (ref - oth)).sum(dim=-1)
    return kl, reference.argmax(dim=-1) == other.argmax(dim=-1)
