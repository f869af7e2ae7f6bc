"""The fast path's tied output layer: the embedding, transposed, with a one-row kernel kept whole."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops

__all__ = ["matvec", "TiedHead"]


def _matvec(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """``torch.mv(matrix, vector)``, kept whole under ``torch.compile``, which would otherwise write
    it out as products and a sum, and fuse the norm before it into every one of its rows.
    (No gradient formula: :class:`TiedHead` uses it only where none is asked for.)"""
    return torch.mv(matrix, vector)


matvec = ops.implement("kvlib::matvec", _matvec)          # declared, with its fake, in kvlib.ops


class TiedHead(nn.Module):
    """The tied output layer: ``x`` ``(batch, k, d_model)`` times ``embedding``'s weight (shared with
    the model's input embedding, not copied), transposed: logits ``(batch, k, vocab)``.

    A single bfloat16 row without gradients (a decode step of one sequence, in a bfloat16 model)
    goes through :func:`matvec`: PyTorch's CPU kernel for a one-row bfloat16 matrix product is
    slower than its matrix-vector product, which computes the same dot products accumulated in
    float32 (the logits agree to bfloat16 rounding). Everything else is ``F.linear``."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.weight = embedding.weight                                      # (vocab, d_model), shared
        self.out_features, self.in_features = embedding.weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16 and x.shape[0] * x.shape[1] == 1 and not torch.is_grad_enabled():
            return matvec(self.weight, x.reshape(-1)).reshape(1, 1, -1)      # (vocab,) -> (1, 1, vocab)
        return F.linear(x, self.weight)
