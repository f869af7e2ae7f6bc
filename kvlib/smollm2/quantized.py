"""The real model's own 4-bit file, loaded as it is stored: each Q4_1 matrix becomes an Int4Linear holding its blocks."""
from __future__ import annotations

import os

import numpy as np
import torch

from ..device import compute_dtype
from ..model import Decoder
from ..quant.linear import Int4Linear
from ..quant.model import linear_layers
from .gguf import RawTensor, config_from_gguf, read_state_dict, unpermute

__all__ = ["load_q4_1_decoder"]


def load_q4_1_decoder(reader, path: str | os.PathLike = "(unnamed)", dtype: torch.dtype | None = None) -> Decoder:
    """A :class:`kvlib.Decoder` that keeps a GGUF file's Q4_1 matrices as they are stored: each
    becomes an :class:`~kvlib.quant.Int4Linear` holding the file's blocks, byte for byte (the rows of
    the query and key matrices put back in the order kvlib's rotation takes), with no float32 copy
    of them on the way; its kernel, PyTorch's int4 kernel, packs them once more for itself. Everything else (the Q8_0 embedding, which is also the
    output layer, and the norms) is decoded and kept in ``dtype``, the dtype the model computes
    in: by default :func:`kvlib.device.compute_dtype` of the CPU, bfloat16 where the CPU multiplies
    it natively and float32 elsewhere.

    The stored weights are the file's exactly; the kernel multiplies by them with the scales and
    zeros rounded from float16 (``d``, ``m + 8 d``) to bfloat16, as it takes them.
    """
    dtype = dtype or compute_dtype("cpu")
    config = config_from_gguf(reader, path)
    state = read_state_dict(reader, config, path, raw=frozenset({"Q4_1"}))
    model = Decoder.empty(config)                                          # the layout only: no weights yet
    for parent, name, linear in linear_layers(model):
        key = next(k for k, v in model.named_modules() if v is linear) + ".weight"
        tensor = state.pop(key)
        if not isinstance(tensor, RawTensor):
            raise ValueError(f"{key} is not stored as Q4_1 in {path}; load the model with quantized=False")
        out, inp = tensor.shape
        blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8).reshape(out, -1))    # (out, in/32 · 20), a copy
        if tensor.permuted_heads:                                          # llama.cpp's row order for q and k
            blocks = unpermute(blocks, tensor.permuted_heads)
        setattr(parent, name, Int4Linear(blocks.contiguous(), inp, out))
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    missing = [n for n, p in model.named_parameters() if p.is_meta] + [n for n, b in model.named_buffers() if b.is_meta]
    if missing:
        raise ValueError(f"{path}: no tensor for {missing[0]} (and {len(missing) - 1} more)")
    return model.to(dtype).eval()
