"""How big the KV cache is: the size formula, and when the cache outweighs the weights.

Every layer keeps a key and a value for every token, in every key/value head, each
``head_dim`` numbers long, for every sequence of the batch:

    bytes = 2 (keys and values) × layers × kv heads × head dim × bytes per number × tokens × batch

A model with multi-head latent attention (:class:`kvlib.cache.MLAShape`, DeepSeek-V2 and V3) keeps
instead one latent vector and one rotated key per token and layer, whatever its heads:

    bytes = (kv_lora_rank + qk_rope_head_dim) × layers × bytes per number × tokens × batch

:func:`kv_cache_bytes` computes it; ``tests/cache/test_memory.py`` checks it against the buffers
a real :class:`kvlib.KVCache` allocates (``KVCache.nbytes``).
"""
from __future__ import annotations

import torch

from ..checks import non_negative_int, positive_int

__all__ = ["bytes_per_number", "kv_cache_bytes", "kv_bytes_per_token", "weight_bytes", "crossover_tokens"]


def bytes_per_number(dtype: torch.dtype | int) -> int:
    """Bytes of one stored number: ``torch.float16 -> 2``; an int is taken as the byte count."""
    if isinstance(dtype, bool):
        raise TypeError("bytes_per_number: expected a torch.dtype or a positive int, got a bool")
    if isinstance(dtype, int):
        return positive_int("bytes per number", dtype)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"expected a torch.dtype or a positive int, got {type(dtype).__name__}")
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_token(config, dtype: torch.dtype | int = torch.float32) -> int:
    """Bytes the cache adds for one token of one sequence: ``2 × layers × kv heads × head dim × bytes``.

    ``config`` is a :class:`kvlib.Config` or anything with ``n_layers``, ``n_kv_heads`` and
    ``head_dim`` (e.g. a :class:`kvlib.cache.ModelShape`). For a model with multi-head latent
    attention (anything with ``kv_lora_rank``, e.g. a :class:`kvlib.cache.MLAShape`), the latent
    and the rotated key instead: ``(kv_lora_rank + qk_rope_head_dim) × layers × bytes``.
    """
    if getattr(config, "kv_lora_rank", None) is not None:          # multi-head latent attention
        return (config.kv_lora_rank + config.qk_rope_head_dim) * config.n_layers * bytes_per_number(dtype)
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_number(dtype)


def kv_cache_bytes(config, seq_len: int, batch: int = 1, dtype: torch.dtype | int = torch.float32) -> int:
    """Bytes of a KV cache holding ``seq_len`` tokens for each of ``batch`` sequences in ``dtype``:

    ``2 (keys and values) × n_layers × n_kv_heads × head_dim × bytes per number × seq_len × batch``
    (:func:`kv_bytes_per_token` × ``seq_len × batch``, which also sizes a multi-head latent cache).

    Equals ``KVCache(config.n_layers, batch, config.n_kv_heads, seq_len, config.head_dim, dtype).nbytes``.
    ``dtype`` may also be a number of bytes (``1`` for int8 numbers, scales not included).
    """
    non_negative_int("seq_len", seq_len)
    positive_int("batch", batch)
    return kv_bytes_per_token(config, dtype) * seq_len * batch


def weight_bytes(n_params: int, dtype: torch.dtype | int = torch.float16) -> int:
    """Bytes of ``n_params`` weights stored in ``dtype`` (16-bit by default, as models are served)."""
    non_negative_int("n_params", n_params)
    return n_params * bytes_per_number(dtype)


def crossover_tokens(config, n_params: int, batch: int = 1, cache_dtype: torch.dtype | int = torch.float16,
                     weight_dtype: torch.dtype | int = torch.float16) -> float:
    """Tokens per sequence at which the cache (for ``batch`` sequences) weighs as much as the weights.

    ``weight bytes / (bytes per token × batch)``; from the next whole token on, the cache is heavier.
    """
    positive_int("batch", batch)
    return weight_bytes(n_params, weight_dtype) / (kv_bytes_per_token(config, cache_dtype) * batch)
