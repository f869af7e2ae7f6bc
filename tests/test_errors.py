"""Bad input gets a clear error that says what was expected."""
from __future__ import annotations

import pytest
import torch

import kvlib
from kvlib import Config, Decoder, KVCache


@pytest.fixture
def model():
    return Decoder(Config.tiny()).eval()


def test_config_rejects_bad_shapes():
    with pytest.raises(ValueError, match="n_kv_heads=3 must divide n_heads=4"):
        Config(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="d_model=30 must be divisible by n_heads=4"):
        Config(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="n_layers must be a positive int"):
        Config(n_layers=0)


@pytest.mark.parametrize("prompt, exc, msg", [
    ([], ValueError, "empty"),
    (torch.tensor([], dtype=torch.long), ValueError, "empty"),
    ([1, 64], ValueError, r"0\.\.63"),
    ([-1, 2], ValueError, r"0\.\.63"),
    (torch.tensor([[1, 2]]), ValueError, "1-D"),
    (torch.tensor([1.0, 2.0]), TypeError, "integer"),
    (["a", "b"], TypeError, "list of ints"),
])
def test_generate_rejects_bad_prompts(model, prompt, exc, msg):
    with pytest.raises(exc, match=msg):
        kvlib.generate(model, prompt, 3)


def test_generate_rejects_too_long(model):
    with pytest.raises(ValueError, match=r"120.*\+ max_new_tokens \(9\) = 129 exceeds .*max_seq_len=128"):
        kvlib.generate(model, [1] * 120, 9)


@pytest.mark.parametrize("kwargs, msg", [
    (dict(max_new_tokens=-1), "non-negative"),
    (dict(max_new_tokens=3, temperature=-1.0), "temperature"),
    (dict(max_new_tokens=3, top_k=0), "top_k"),
])
def test_generate_rejects_bad_options(model, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        kvlib.generate(model, [1, 2], **kwargs)


@pytest.mark.parametrize("ids, exc, msg", [
    (torch.tensor([1, 2, 3]), ValueError, r"\(batch, seq\)"),
    (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, r"\(batch, seq\)"),
    (torch.zeros(1, 3), TypeError, "integer token ids"),
    (torch.zeros(1, 0, dtype=torch.long), ValueError, "empty"),
    (torch.tensor([[0, 64]]), ValueError, r"0\.\.63"),
    (torch.zeros(1, 129, dtype=torch.long), ValueError, "max_seq_len=128"),
    ([[1, 2]], TypeError, "torch.Tensor"),
])
def test_forward_rejects_bad_ids(model, ids, exc, msg):
    with pytest.raises(exc, match=msg):
        model(ids)


def test_cache_overflow_names_both_numbers(model):
    cache = KVCache.for_model(model, batch=1, max_len=10)
    model(torch.zeros(1, 8, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"holds 8 of max_len=10 .* 3 more \(would need 11\)"):
        model(torch.zeros(1, 3, dtype=torch.long), cache)
    assert cache.pos == 8, "a refused write must not move the cache"
    model(torch.zeros(1, 2, dtype=torch.long), cache)       # exactly full is fine
    assert cache.pos == 10


def test_cache_for_other_batch_or_dtype(model):
    with pytest.raises(ValueError, match="batch size 2, ids have batch size 1"):
        model(torch.zeros(1, 2, dtype=torch.long), KVCache.for_model(model, batch=2))
    other = KVCache(2, 1, 2, 16, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="float64 but the model computes in torch.float32"):
        model(torch.zeros(1, 2, dtype=torch.long), other)


def test_cache_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        KVCache(1, 1, 1, 0, 4)


def test_cache_reset_and_size(model):
    cfg = model.config
    cache = KVCache.for_model(model, batch=3, max_len=20)
    # 2 (keys and values) x layers x batch x kv heads x positions x head dim x 4 bytes (float32)
    assert cache.nbytes == 2 * cfg.n_layers * 3 * cfg.n_kv_heads * 20 * cfg.head_dim * 4
    model(torch.zeros(3, 5, dtype=torch.long), cache)
    assert cache.pos == 5
    cache.reset()
    assert cache.pos == 0
