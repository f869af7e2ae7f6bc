"""kvlib: the code behind Chapter 13 of *AI From Scratch* (Making Inference Cheap).

The decoder a learner reads sits at the top, one idea per file: :mod:`.config`,
:mod:`.rope`, :mod:`.attention`, :mod:`.model`, :mod:`.generate` (and :mod:`.compiled`, its
optional compiled step). Each other subject has a folder of its own:

- :mod:`kvlib.cache`: the KV caches and the memory they take;
- :mod:`kvlib.serve`: many sequences at once: batched generation, static and continuous batching;
- :mod:`kvlib.smollm2`: the real model, SmolLM2-135M-Instruct, read from its GGUF file;
- :mod:`kvlib.quant`: the weights in 8 and 4 bits, one layer per format;
- :mod:`kvlib.speculative`: speculative decoding's draft and verify steps;
- :mod:`kvlib.measure`: time, arithmetic, memory and quality measurements;
- :mod:`kvlib.widgets`: the notebooks' widgets and plots;
- :mod:`kvlib.exercises`: the checks of the exercises, one file per section;
- :mod:`kvlib.data`: the texts the real model runs on;
- :mod:`kvlib.ops`: kvlib's operators, each declared once;
- :mod:`kvlib.fast` (the fast path's kernels and speed knobs) and :mod:`kvlib.bench` (the
  benchmark), a wing on top of everything else.

Imports run one way: the decoder and its caches import nothing from measure, widgets or
exercises. Importing ``kvlib`` loads no model and downloads nothing; the real-model names
(``kvlib.load_smollm2`` and the like) are imported on first use, so ``import kvlib`` stays
quick and does not pull in ``gguf`` or ``tokenizers``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .cache import HalfKVCache, Int8KVCache, KVCache, LayerKVCache, SlidingWindowKVCache, kv_cache_bytes
from .config import Config
from .device import default_device, describe_machine
from .generate import Generation, StepRecord, generate, generate_batch, sample
from .model import Decoder

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__
    from .cache import MODEL_SHAPES
    from .smollm2 import ModelFileError, Tokenizer, load_smollm2, smollm2_path

# name -> submodule that defines it, imported when the name is first used
_LAZY = {
    "load_smollm2": "smollm2",
    "Tokenizer": "smollm2",
    "ModelFileError": "smollm2",
    "smollm2_path": "smollm2",
    "MODEL_SHAPES": "cache",
}

__all__ = ["Config", "Decoder", "KVCache", "LayerKVCache", "generate", "generate_batch", "sample", "Generation",
           "StepRecord", "default_device", "describe_machine",
           "load_smollm2", "Tokenizer", "ModelFileError", "smollm2_path",
           "SlidingWindowKVCache", "Int8KVCache", "HalfKVCache", "kv_cache_bytes", "MODEL_SHAPES"]
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    """Import the real-model helpers on first access (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value          # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
