"""kvlib: the code behind Chapter 13 of *AI From Scratch* (Making Inference Cheap).

A small Llama-style decoder in plain PyTorch, its KV cache, cached and uncached
generation, and the measuring, plotting and exercise helpers the notebooks use.
Importing it loads no model and downloads nothing.

The real model, ``model, tok = kvlib.load_smollm2()`` (SmolLM2-135M-Instruct), and the
names around it are imported on first use only, so ``import kvlib`` stays quick and does
not pull in ``gguf`` or ``tokenizers``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .cache import KVCache, LayerKVCache, SlidingWindowKVCache
from .config import Config
from .generate import Generation, StepRecord, generate
from .memory import kv_cache_bytes
from .model import Decoder
from .quant_cache import HalfKVCache, Int8KVCache

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__
    from .smollm2 import load_smollm2
    from .tokenizer import Tokenizer
    from .model_shapes import MODEL_SHAPES
    from .weights import ModelFileError, smollm2_path

# name -> submodule that defines it, imported when the name is first used
_LAZY = {
    "load_smollm2": "smollm2",
    "Tokenizer": "tokenizer",
    "ModelFileError": "weights",
    "smollm2_path": "weights",
    "MODEL_SHAPES": "model_shapes",
}

__all__ = ["Config", "Decoder", "KVCache", "LayerKVCache", "generate", "Generation", "StepRecord",
           "load_smollm2", "Tokenizer", "ModelFileError", "smollm2_path",
           "SlidingWindowKVCache", "Int8KVCache", "HalfKVCache", "kv_cache_bytes", "MODEL_SHAPES"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import the real-model helpers on first access (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value          # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
