"""Tiny random models shared by the tests (plain functions, so that hypothesis tests can use
them too): seeded, built once per dtype and reused."""
from __future__ import annotations

import functools

import torch

from kvlib import Config, Decoder


@functools.lru_cache(maxsize=None)
def tiny_model(dtype: torch.dtype = torch.float32, seed: int = 0) -> Decoder:
    """:meth:`kvlib.Config.tiny` (2 layers, grouped-query attention, vocabulary 64), seeded, in ``dtype``.
    Shared: do not change its weights."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Decoder(Config.tiny()).to(dtype).eval()
