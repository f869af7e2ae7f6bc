"""The fast path: the chapter's decoder with its matrices fused at load time, and its kernels chosen by measurement
(among them kvlib's own CPU kernels for the file's Q4_1 and Q8_0 blocks, :mod:`.kernels`).

:func:`fuse` returns a copy of a :class:`kvlib.Decoder` whose query, key and value
projections are one matrix, and whose MLP's gate and up projections are one matrix, in
whatever format the layers are stored (float, int8 or the native 4-bit layers). A decode
step then makes 4 matrix products per layer instead of 7: fewer kernel calls, each on a
larger matrix. The model computes the same function; only the order of a few roundings
may change. The readable modules the notebooks teach are untouched.

:func:`pack` (:mod:`.packed`) lays a float32 model's weights out once for oneDNN's matrix
kernels, as vLLM's CPU build does, and :func:`paged_attention` reads the serving engine's
paged pool in place, as vLLM's attention kernel does: the serving comparison with vLLM runs kvlib's
engine with both.
"""
from __future__ import annotations

from ..model import Decoder
from .choose import KernelChoice, apply_choice, kernel_choice
from .dense import DenseFrom
from .gguf_linear import Q4_1, Q8_0, Q8_0Linear
from .fused import FusedAttention, FusedMLP, concat_linears, fuse, is_fused
from .heads import TiedHead
from .kernels import kernels_missing, paged_attention
from .packed import PackedLinear, is_packed, pack, packing_unavailable

CPP_WRAPPER = {"cpp_wrapper": True}      # Inductor calls the compiled step's kernels from C++, not Python

__all__ = ["CPP_WRAPPER", "compile_fast_step", "fuse", "is_fused", "FusedAttention", "FusedMLP", "concat_linears", "fast_model", "KernelChoice",
           "kernel_choice", "apply_choice", "DenseFrom", "Q4_1", "Q8_0", "Q8_0Linear", "TiedHead", "PackedLinear", "pack",
           "is_packed", "packing_unavailable", "paged_attention", "kernels_missing"]


def fast_model(model: Decoder, choice: KernelChoice | None = None) -> Decoder:
    """The fast path of a native 4-bit :class:`kvlib.Decoder`: :func:`fuse`'d, with the kernels
    this machine measured fastest (:func:`kernel_choice`, measured once and kept; or ``choice``).
    Compile its decode step with ``generate(..., compile=True)``; calling
    :func:`compile_fast_step` before that makes the step call its kernels from C++ (shorter steps,
    a longer first compile: the benchmark does it).
    ``model`` is left as it was."""
    out = fuse(model)
    return apply_choice(out, choice or kernel_choice(out))


def compile_fast_step(model: Decoder):
    """``model``'s compiled decode step made with Inductor's C++ wrapper (:data:`CPP_WRAPPER`): a
    shorter step than the Python wrapper's, a longer first compile. Call it before the model's first
    compiled call (``generate(..., compile=True)`` then uses it)."""
    from ..compiled import compiled_decode_step

    return compiled_decode_step(model, options=CPP_WRAPPER)
