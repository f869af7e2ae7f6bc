"""Dense float32 layers with their weights packed once for oneDNN, as vLLM's CPU build does.

PyTorch's ``F.linear`` on the CPU calls the BLAS it was built with (MKL) on the weight as it is
stored, for every call. vLLM's CPU build (``dispatch_cpu_unquantized_gemm`` in its
``model_executor/layers/utils.py``) instead reorders each weight once, at load time, into the
blocked layout oneDNN's matrix kernels read fastest, and calls oneDNN on it. PyTorch ships the same
two steps: ``torch.ops.mkldnn._reorder_linear_weight`` (once) and
``torch.ops.mkldnn._linear_pointwise`` (every call). The product is the same sum of the same
float32 numbers; only the order of the additions, and so the last bits, may differ.

:func:`pack` returns a copy of a float32 :class:`kvlib.Decoder` (plain, :func:`~kvlib.fast.fuse`'d, or
fused on the way with ``fused=True``) whose ``nn.Linear`` layers, and its tied output layer, are
:class:`PackedLinear`. Where oneDNN is
not in this PyTorch build, or the model is not a float32 model on the CPU, :func:`pack` says why
and changes nothing.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..compiled import define_op
from ..device import return_freed_memory
from ..model import Decoder
from .fused import FusedAttention, FusedMLP

__all__ = ["PackedLinear", "packed_linear", "pack", "pack_linears", "packing_unavailable", "is_packed"]


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """oneDNN's product of ``x`` ``(..., in)`` with a weight :class:`PackedLinear` packed: ``(..., out_features)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")


# An operator of its own for torch.compile, which calls it as it is (as vLLM's compiled model calls
# its oneDNN products), where Inductor's own lowering of oneDNN's operator wants the number of rows fixed.
packed_linear = define_op("packed_linear", _packed_linear,
                          lambda x, packed, out_features: x.new_empty(*x.shape[:-1], out_features))


class PackedLinear(nn.Module):
    """``F.linear(x, weight)`` (no bias) on a float32 weight ``(out, in)`` packed for oneDNN;
    ``x`` ``(..., in)`` to ``(..., out)``. Only the packed copy is kept (``packed``), not the weight
    as it was: a packed model holds its weights once."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"PackedLinear takes a 2-d float32 weight on the CPU, got {weight.dtype} "
                             f"{tuple(weight.shape)} on {weight.device}")
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():           # traced: an operator of its own (packed_linear)
            return packed_linear(x, self.packed, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [None], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed float32"


def packing_unavailable(model: nn.Module) -> str | None:
    """``None`` when :func:`pack` can pack ``model``; else why not, in a sentence."""
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    weight = next(model.parameters())
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return f"pack takes a float32 model on the CPU, got {weight.dtype} on {weight.device}"
    return None


def is_packed(model: nn.Module) -> bool:
    """Whether ``model`` holds :class:`PackedLinear` layers (made by :func:`pack`)."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


def pack_linears(module: nn.Module) -> None:
    """Replace, in place, every ``nn.Linear`` without a bias under ``module`` by a :class:`PackedLinear`."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.bias is None:
                setattr(parent, name, PackedLinear(child.weight))


@torch.no_grad()
def pack(model: Decoder, *, fused: bool = False) -> Decoder:
    """A copy of ``model`` whose ``nn.Linear`` layers and tied output layer are :class:`PackedLinear`,
    with ``fused=True`` fused first (:class:`~kvlib.fast.FusedAttention`, :class:`~kvlib.fast.FusedMLP`);
    ``model`` is left as it was. The copy's other parameters (the embedding, the norms) are
    ``model``'s own tensors, shared, not copied; its output layer is a packed copy of the embedding.
    Each layer is fused and packed in turn, so a model's worth of copies is never held at once.
    ValueError, saying why, where packing is unavailable (:func:`packing_unavailable`) or ``model``
    has an output layer of its own."""
    if not isinstance(model, Decoder):
        raise TypeError(f"pack takes a kvlib.Decoder, got {type(model).__name__}")
    why = packing_unavailable(model)
    if why:
        raise ValueError(f"cannot pack this model: {why}; use it as it is")
    if model.lm_head is not None:
        raise ValueError("this model already has an output layer of its own (quantized, or packed): pack the "
                         "float32 model it came from")
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    out = copy.deepcopy(model, memo=shared)                        # new modules, the same tensors
    for block in out.blocks:
        if fused and not isinstance(block.attn, FusedAttention):
            block.attn, block.mlp = FusedAttention(block.attn), FusedMLP(block.mlp)
        pack_linears(block)
    out.lm_head = PackedLinear(out.embed.weight)                   # (vocab, d_model): the tied embedding
    return_freed_memory()                                          # the fused float copies
    return out.eval()
