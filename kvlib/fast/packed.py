"""Dense float32 layers with their weights laid out once for a matrix kernel, as vLLM's CPU build does.

PyTorch's ``F.linear`` on the CPU calls the BLAS it was built with (MKL) on the weight as it is
stored, for every call. vLLM's CPU build (``dispatch_cpu_unquantized_gemm`` in its
``model_executor/layers/utils.py``) instead reorders each weight once, at load time, into the
blocked layout oneDNN's matrix kernels read fastest, and calls oneDNN on it. PyTorch ships the same
two steps: ``torch.ops.mkldnn._reorder_linear_weight`` (once) and
``torch.ops.mkldnn._linear_pointwise`` (every call). kvlib has a layout and kernel of its own for
the few rows of a decode step, ``panels.cpp`` (:mod:`.kernels`): each weight in panels of 16 output
features, read once, front to back, at the speed the memory gives it. The product is the same sum
of the same float32 numbers either way; only the order of the additions, and so the last bits,
may differ.

:func:`pack` returns a copy of a float32 :class:`kvlib.Decoder` (plain, :func:`~kvlib.fast.fuse`'d, or
fused on the way with ``fused=True``) whose ``nn.Linear`` layers, and its tied output layer, are
:class:`PackedLinear`, for the kernel :func:`packing_kernel` names. Where neither kernel is here,
or the model is not a float32 model on the CPU, :func:`pack` says why and changes nothing.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .. import ops
from ..device import return_freed_memory
from ..model import Decoder
from .fused import FusedAttention, FusedMLP
from .kernels import kernels_missing, load, panel_simd

__all__ = ["KERNELS", "PackedLinear", "packed_linear", "pack", "pack_linears", "packing_kernel", "packing_unavailable",
           "is_packed"]

KERNELS = {"onednn": "oneDNN", "panels": "kvlib's panel kernel"}      # PackedLinear's kernels, by name


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """oneDNN's product of ``x`` ``(..., in)`` with a weight :class:`PackedLinear` packed: ``(..., out_features)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")


# An operator of its own for torch.compile, which calls it as it is (as vLLM's compiled model calls
# its oneDNN products), where Inductor's own lowering of oneDNN's operator wants the number of rows fixed.
packed_linear = ops.implement("kvlib::packed_linear", _packed_linear)


class PackedLinear(nn.Module):
    """``F.linear(x, weight)`` (no bias) on a float32 weight ``(out, in)`` laid out once for a
    kernel (:data:`KERNELS`): ``"onednn"``, oneDNN's blocked layout; ``"panels"``, kvlib's panels
    of 16 outputs (``panels.cpp``); ``x`` ``(..., in)`` to ``(..., out)``. Only the packed copy is
    kept (``packed``), not the weight as it was: a packed model holds its weights once."""

    def __init__(self, weight: torch.Tensor, kernel: str = "onednn") -> None:
        super().__init__()
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError(f"PackedLinear takes a 2-d float32 weight on the CPU, got {weight.dtype} "
                             f"{tuple(weight.shape)} on {weight.device}")
        if kernel not in KERNELS:
            raise ValueError(f"PackedLinear's kernel is one of {sorted(KERNELS)}, got {kernel!r}")
        if kernel == "panels" and not load():
            why = kernels_missing()
            raise RuntimeError(f"PackedLinear's panels need kvlib's kernels, which are not here: {why}; "
                               "use kernel='onednn'")
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel
        w = weight.detach()
        packed = torch.ops.kvlib_cpu.panel_pack(w) if kernel == "panels" else \
            torch.ops.mkldnn._reorder_linear_weight(w, None)
        self.register_buffer("packed", packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "panels":                 # a C++ operator, traced as it is
            return torch.ops.kvlib_cpu.panel_mm(x, self.packed, self.out_features)
        if torch.compiler.is_compiling():           # traced: an operator of its own (packed_linear)
            return packed_linear(x, self.packed, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [None], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"float32 packed for {KERNELS[self.kernel]}")


def packing_kernel() -> str | None:
    """The kernel :func:`pack` uses here by default: ``"panels"`` where kvlib's kernels build with
    vector instructions (AVX-512 or AVX2: there the panels read the weights faster than oneDNN for
    the few rows of a decode step, and kept pace with it at a few hundred); else ``"onednn"`` where
    PyTorch has oneDNN; else ``"panels"`` in plain loops where kvlib's kernels build at all; ``None``
    where there is neither. The page *From kvlib to vLLM* gives the measurements."""
    ours = load()
    if ours and panel_simd() in ("avx512", "avx2"):
        return "panels"
    if torch.backends.mkldnn.is_available():
        return "onednn"
    return "panels" if ours else None


def packing_unavailable(model: nn.Module, kernel: str | None = None) -> str | None:
    """``None`` when :func:`pack` can pack ``model`` for ``kernel`` (default :func:`packing_kernel`);
    else why not, in a sentence."""
    kernel = kernel or packing_kernel()
    no_onednn = "this PyTorch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if kernel is None:
        return f"{no_onednn} and kvlib's kernels are not here: {kernels_missing()}"
    if kernel == "onednn" and not torch.backends.mkldnn.is_available():
        return no_onednn
    if kernel == "panels" and not load():
        return f"kvlib's kernels are not here: {kernels_missing()}"
    weight = next(model.parameters())
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return f"pack takes a float32 model on the CPU, got {weight.dtype} on {weight.device}"
    return None


def is_packed(model: nn.Module) -> bool:
    """Whether ``model`` holds :class:`PackedLinear` layers (made by :func:`pack`)."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


def pack_linears(module: nn.Module, kernel: str = "onednn") -> None:
    """Replace, in place, every ``nn.Linear`` without a bias under ``module`` by a :class:`PackedLinear`
    for ``kernel``."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.bias is None:
                setattr(parent, name, PackedLinear(child.weight, kernel))


@torch.no_grad()
def pack(model: Decoder, *, fused: bool = False, kernel: str | None = None) -> Decoder:
    """A copy of ``model`` whose ``nn.Linear`` layers and tied output layer are :class:`PackedLinear`
    for ``kernel`` (default :func:`packing_kernel`), with ``fused=True`` fused first
    (:class:`~kvlib.fast.FusedAttention`, :class:`~kvlib.fast.FusedMLP`); ``model`` is left as it
    was. The copy's other parameters (the embedding, the norms) are ``model``'s own tensors,
    shared, not copied; its output layer is a packed copy of the embedding.
    Each layer is fused and packed in turn, so a model's worth of copies is never held at once.
    ValueError, saying why, where packing is unavailable (:func:`packing_unavailable`) or ``model``
    has an output layer of its own."""
    if not isinstance(model, Decoder):
        raise TypeError(f"pack takes a kvlib.Decoder, got {type(model).__name__}")
    kernel = kernel or packing_kernel()
    why = packing_unavailable(model, kernel)
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
        pack_linears(block, kernel)
    out.lm_head = PackedLinear(out.embed.weight, kernel)           # (vocab, d_model): the tied embedding
    return_freed_memory()                                          # the fused float copies
    return out.eval()
