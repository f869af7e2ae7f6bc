"""Quantizing a whole decoder: every linear layer swapped for an 8- or 4-bit one (as gpt-fast
does). (The real model's own 4-bit file, loaded as it is stored: :mod:`kvlib.smollm2.quantized`.)"""
from __future__ import annotations

import copy

from torch import nn

from ..device import compute_dtype, return_freed_memory
from ..model import Decoder
from .formats import Q4_1_BLOCK
from .linear import Int4Linear, Int8Linear, QuantizedLinear

__all__ = ["SCHEMES", "quantize", "is_quantized", "linear_layers"]

SCHEMES = ("int8", "int4")


def is_quantized(model: nn.Module) -> bool:
    """Whether any layer of ``model`` is already stored in 8 or 4 bits."""
    return any(isinstance(m, QuantizedLinear) for m in model.modules())


def linear_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every ``nn.Linear`` of ``model``."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, nn.Linear)]


def quantize(model: Decoder, scheme: str, *, output_layer: bool = False) -> Decoder:
    """A copy of ``model`` whose linear layers store their weights in ``scheme``; ``model`` itself is
    left as it was. The copy computes in :func:`kvlib.device.compute_dtype` of ``model``'s device:
    bfloat16 where it is fast (the CPU kernels multiply in bfloat16 whatever the model computes
    in), float32 on a CPU without bfloat16 arithmetic.

    ``scheme`` is ``"int8"`` (one scale per output channel, symmetric) or ``"int4"`` (Q4_1 blocks:
    a scale and a minimum per 32 inputs, asymmetric, as the real model's file stores them). The output layer, which is the
    embedding transposed, stays the embedding itself unless ``output_layer=True``
    (then it becomes a per-row int8 layer, whatever the scheme): off by default, because it
    moves the predictions more than the layers do for the bytes it saves (the quantization
    section measures both).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: use one of {', '.join(map(repr, SCHEMES))}")
    if is_quantized(model):
        raise ValueError("this model is already quantized: quantize the float model it came from")
    for _, name, linear in linear_layers(model):
        if scheme == "int4" and linear.in_features % Q4_1_BLOCK:
            raise ValueError(f"int4 stores blocks of {Q4_1_BLOCK} inputs, which do not divide the input width "
                             f"{linear.in_features} of a {name} layer; use int8")
    # The copy's linear layers, replaced below, hold the original's weights meanwhile rather than copies of
    # them: a float32 model's worth of copies is never made (nor freed, which a process rarely gives back).
    weights = {id(linear.weight): linear.weight for _, _, linear in linear_layers(model)}
    out = copy.deepcopy(model, memo=weights)
    for (parent, name, linear), (_, _, source) in zip(linear_layers(out), linear_layers(model)):
        weight = source.weight.detach().float()                         # from the float32 original, not a copy in bf16
        layer = Int8Linear.from_weight(weight) if scheme == "int8" else Int4Linear.from_weight(weight)
        setattr(parent, name, layer)
    if output_layer:
        out.lm_head = Int8Linear.from_weight(model.embed.weight.detach().float())
    out = out.to(compute_dtype(model.device)).eval()
    return_freed_memory()                                               # the rounding's temporaries
    return out
