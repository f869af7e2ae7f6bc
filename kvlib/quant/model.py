"""Quantizing a whole decoder: every linear layer swapped for an 8- or 4-bit one (as gpt-fast
does), and the real model's own 4-bit file loaded as it is stored."""
from __future__ import annotations

import copy
import os

import torch
from torch import nn

from ..model import Decoder
from ..rope import RotaryEmbedding
from .formats import q4_1_as_int4_groups
from .linear import COMPUTE_DTYPE, INT4_GROUP_SIZES, Int4Linear, Int8Linear

__all__ = ["SCHEMES", "quantize", "is_quantized", "load_q4_1_decoder"]

SCHEMES = ("int8", "int4")


def is_quantized(model: nn.Module) -> bool:
    """Whether any layer of ``model`` is already stored in 8 or 4 bits."""
    return any(isinstance(m, (Int8Linear, Int4Linear)) for m in model.modules())


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every ``nn.Linear`` of ``model``."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if isinstance(child, nn.Linear)]


def quantize(model: Decoder, scheme: str, *, group_size: int = 32, output_layer: bool = False) -> Decoder:
    """A copy of ``model`` whose linear layers store their weights in ``scheme``, computing in
    bfloat16 (what the CPU kernels take); ``model`` itself is left as it was.

    ``scheme`` is ``"int8"`` (one scale per output channel, symmetric) or ``"int4"`` (a scale
    and a zero per ``group_size`` inputs, asymmetric). The output layer, which is the
    embedding transposed, stays a bfloat16 copy of the embedding unless ``output_layer=True``
    (then it becomes a per-row int8 layer, whatever the scheme): off by default, because it
    moves the predictions more than the layers do for the bytes it saves (the quantization
    section measures both).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: use one of {', '.join(map(repr, SCHEMES))}")
    if is_quantized(model):
        raise ValueError("this model is already quantized: quantize the float model it came from")
    if scheme == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size={group_size!r}: PyTorch's int4 kernel takes groups of "
                         f"{', '.join(map(str, INT4_GROUP_SIZES))} inputs")
    for _, name, linear in _linears(model):
        if scheme == "int4" and linear.in_features % group_size:
            raise ValueError(f"group_size={group_size} does not divide the input width {linear.in_features} of "
                             f"a {name} layer; choose a divisor of it")
    out = copy.deepcopy(model)
    for (parent, name, linear), (_, _, source) in zip(_linears(out), _linears(model)):
        weight = source.weight.detach().float()                         # from the float32 original, not a copy in bf16
        layer = Int8Linear.from_weight(weight) if scheme == "int8" else Int4Linear.from_weight(weight, group_size)
        setattr(parent, name, layer)
    if output_layer:
        out.lm_head = Int8Linear.from_weight(model.embed.weight.detach().float())
    return out.to(COMPUTE_DTYPE).eval()


def load_q4_1_decoder(reader, path: str | os.PathLike = "(unnamed)") -> Decoder:
    """A :class:`kvlib.Decoder` that keeps a GGUF file's Q4_1 matrices as they are stored: each
    becomes an :class:`~kvlib.quant.Int4Linear` with ``scale = d`` and ``zero = m + 8 d``, with no
    float32 copy of them on the way. Everything else (the Q8_0 embedding, which is also the
    output layer, and the norms) is decoded and kept in bfloat16, the dtype the model computes in.

    Exact up to bf16: the 4-bit integers are the file's; the scales and zeros are rounded from
    float16 (``d``, ``m``) to bfloat16, as the kernel takes them.
    """
    from ..smollm2.gguf import RawTensor, config_from_gguf, read_state_dict, unpermute

    config = config_from_gguf(reader, path)
    state = read_state_dict(reader, config, path, raw=frozenset({"Q4_1"}))
    with torch.device("meta"):                                             # the layout only: no weights yet
        model = Decoder(config)
    for parent, name, linear in _linears(model):
        key = next(k for k, v in model.named_modules() if v is linear) + ".weight"
        tensor = state.pop(key)
        if not isinstance(tensor, RawTensor):
            raise ValueError(f"{key} is not stored as Q4_1 in {path}; load the model with quantized=False")
        q, scale, zero = q4_1_as_int4_groups(tensor.data, tensor.shape)
        if tensor.permuted_heads:                                          # llama.cpp's row order for q and k
            q, scale, zero = (unpermute(t, tensor.permuted_heads) for t in (q, scale, zero))
        setattr(parent, name, Int4Linear(q, scale, zero, group_size=32))
    model.load_state_dict({k: v.to(COMPUTE_DTYPE) for k, v in state.items()}, strict=False, assign=True)
    model.rope = RotaryEmbedding(config.head_dim, config.max_seq_len, config.rope_theta)
    missing = [n for n, p in model.named_parameters() if p.is_meta] + [n for n, b in model.named_buffers() if b.is_meta]
    if missing:
        raise ValueError(f"{path}: no tensor for {missing[0]} (and {len(missing) - 1} more)")
    return model.to(COMPUTE_DTYPE).eval()
