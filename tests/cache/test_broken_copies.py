"""The equivalence tests must be able to fail: run their check on deliberately broken caches."""
from __future__ import annotations

import pytest
import torch

from kvlib import Config, Decoder
from kvlib.cache import LayerKVCache
from kvlib.rope import RotaryEmbedding

from cache.test_equivalence import cached_logits


def _differs(model: Decoder, ids: torch.Tensor, split: int, chunk: int) -> bool:
    with torch.no_grad():
        return not torch.allclose(cached_logits(model, ids, split, chunk), model(ids), atol=1e-5, rtol=0)


@pytest.fixture
def case():
    torch.manual_seed(1)
    model = Decoder(Config.tiny()).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    return model, ids


def test_intact_cache_passes(case):
    model, ids = case
    assert not _differs(model, ids, split=5, chunk=1)


def test_forgotten_rope_offset_is_caught(case, monkeypatch):
    model, ids = case
    original = RotaryEmbedding.at
    monkeypatch.setattr(RotaryEmbedding, "at", lambda self, positions: original(self, positions - positions[:, :1]))
    assert _differs(model, ids, split=5, chunk=1)


def test_off_by_one_rope_offset_is_caught(case, monkeypatch):
    model, ids = case
    original = RotaryEmbedding.at
    monkeypatch.setattr(RotaryEmbedding, "at", lambda self, positions: original(self, positions + (positions[:, :1] > 0)))
    assert _differs(model, ids, split=5, chunk=2)


def test_cache_that_keeps_only_new_tokens_is_caught(case, monkeypatch):
    model, ids = case

    def forgetful(self, positions, k, v, end, contiguous=False):
        return k, v, positions                        # never looks at the stored tokens
    monkeypatch.setattr(LayerKVCache, "update", forgetful)
    assert _differs(model, ids, split=5, chunk=1)


def test_cache_that_overwrites_slot_zero_is_caught(case, monkeypatch):
    model, ids = case
    original = LayerKVCache.update

    def overwrite(self, positions, k, v, end, contiguous=False):         # every chunk after the first written from slot 0
        start = positions - positions[:, :1] if int(positions[0, 0]) else positions
        return original(self, start, k, v, end)
    monkeypatch.setattr(LayerKVCache, "update", overwrite)
    assert _differs(model, ids, split=5, chunk=1)
