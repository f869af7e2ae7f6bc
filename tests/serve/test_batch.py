"""kvlib.generate_batch: a batch computes what each prompt computes alone, whatever the lengths,
with every cache class; and the checks that say so fail on the classic mistakes of ragged
batches (reading the last column, padding on the left, one position for every row)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlib
from kvlib import Config, Decoder, KVCache
from kvlib.cache import HalfKVCache, Int8KVCache, KiviKVCache, SlidingWindowKVCache

from tiny_models import tiny_model

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
MQA = Decoder(Config(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=1, d_mlp=48,
                     max_seq_len=64)).double().eval()
prompt_sets = st.lists(st.lists(st.integers(0, 39), min_size=1, max_size=12), min_size=1, max_size=5)


def model_of(which):
    return MQA if which == "mqa" else tiny_model(which)


def batched_equals_solo(model, prompts, n_new, atol=1e-10, **cache_kwargs) -> bool:
    make = cache_kwargs.pop("make", None)
    alone = [kvlib.generate(model, p, n_new, keep_logits=True, cache=make(model, 1) if make else None)
             for p in prompts]
    together = kvlib.generate_batch(model, prompts, n_new, keep_logits=True,
                                    cache=make(model, len(prompts)) if make else None)
    return all(a == t and torch.allclose(a.logits, t.logits, atol=atol, rtol=0) for a, t in zip(alone, together))


@PROPERTY
@given(prompts=prompt_sets, n_new=st.integers(1, 6), which=st.sampled_from([torch.float64, "mqa"]))
def test_batched_equals_solo(prompts, n_new, which):
    assert batched_equals_solo(model_of(which), prompts, n_new)


CACHES = {
    "int8": lambda m, b: Int8KVCache.for_model(m, batch=b, max_len=40),
    "16-bit": lambda m, b: HalfKVCache.for_model(m, batch=b, max_len=40, storage=torch.float16),
    "sliding": lambda m, b: SlidingWindowKVCache.for_model(m, batch=b, window=5),
    "kivi": lambda m, b: KiviKVCache.for_model(m, batch=b, max_len=40, group=4, recent=3),
}


@PROPERTY
@given(prompts=prompt_sets, n_new=st.integers(1, 6), kind=st.sampled_from(sorted(CACHES)))
def test_every_cache_class_works_batched(prompts, n_new, kind):
    """Each cache class keeps one contract for per-row positions, so a batch equals its rows alone."""
    assert batched_equals_solo(tiny_model(torch.float64), prompts, n_new, make=CACHES[kind])


@PROPERTY
@given(prompts=prompt_sets, n_new=st.integers(1, 4))
def test_batched_equals_solo_in_float32_up_to_rounding(prompts, n_new):
    model = tiny_model(torch.float32)
    alone = [kvlib.generate(model, p, n_new, keep_logits=True) for p in prompts]
    together = kvlib.generate_batch(model, prompts, n_new, keep_logits=True)
    for a, t in zip(alone, together):
        torch.testing.assert_close(t.logits[:len(a)], a.logits[:len(t)], atol=1e-4, rtol=1e-4)


def test_each_row_stops_at_its_own_stop_token():
    model = tiny_model(torch.float64)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    free = kvlib.generate_batch(model, prompts, 10)
    stop = free[1][2]
    stopped = kvlib.generate_batch(model, prompts, 10, stop_token=stop)
    for f, s in zip(free, stopped):
        expected = f[:f.index(stop) + 1] if stop in f else f
        assert s == expected
    assert len(stopped[0].records) <= 10


def test_the_result_carries_its_records_and_logits_when_asked():
    model = tiny_model(torch.float64)
    out = kvlib.generate_batch(model, [[1, 2], [3, 4, 5]], 4)
    assert all(isinstance(g, kvlib.Generation) and g.logits is None for g in out)
    assert [r.tokens_in for r in out[0].records] == [6, 2, 2, 2] and out[0].records is out[1].records
    with_logits = kvlib.generate_batch(model, [[1, 2], [3, 4, 5]], 4, keep_logits=True)
    assert with_logits == out and with_logits[0].logits.shape == (4, 64)


# ------------------------------------------------------------------- the checks can fail

def test_reading_the_last_column_of_a_right_padded_batch_is_caught():
    """Without n_tokens the model reads the last column: for a padded row, the score after a pad."""
    model = tiny_model(torch.float64)
    original = Decoder.forward

    def last_column(self, ids, cache=None, **kwargs):
        kwargs.pop("n_tokens", None)
        return original(self, ids, cache, **kwargs)
    with mock.patch.object(Decoder, "forward", last_column):
        assert not batched_equals_solo(model, [[1, 2, 3, 4, 5], [6, 7]], 3)


def test_one_position_for_every_row_is_caught():
    """Rows at different lengths rotated by one shared position (the longest row's) write other tokens."""
    model = tiny_model(torch.float64)
    original = KVCache.positions

    def shared(self, n_new):
        return original(self, n_new).amax(dim=0, keepdim=True).expand(self.batch, n_new)
    with mock.patch.object(KVCache, "positions", shared):
        assert not batched_equals_solo(model, [[1, 2, 3, 4, 5, 6, 7, 8], [6, 7]], 6)


def test_left_padding_is_caught():
    """Pads put before a prompt are attended to and push its tokens to later positions."""
    model = tiny_model(torch.float64)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    logits = model(ids)[:, -1]
    alone = torch.stack([model(torch.tensor([p]))[0, -1] for p in prompts])
    assert torch.allclose(logits[0], alone[0]) and not torch.allclose(logits[1], alone[1], atol=1e-3)


# ------------------------------------------------------------------- clear errors

@pytest.mark.parametrize("prompts, error, message", [
    ([], ValueError, "no prompts"),
    ([[1, 2], []], ValueError, "prompt 1 is empty"),
    ([[1, 2], [3, 64]], ValueError, "prompt 1 holds token id 64, outside the vocabulary 0..63"),
    ([[1, 2], [3] * 126], ValueError, r"prompt 1: 126 tokens \+ max_new_tokens \(5\) = 131 exceeds"),
    ("abc", TypeError, "list of token-id lists"),
])
def test_generate_batch_says_which_prompt_is_wrong(prompts, error, message):
    with pytest.raises(error, match=message):
        kvlib.generate_batch(tiny_model(torch.float64), prompts, 5)


def test_generate_batch_rejects_a_stop_token_outside_the_vocabulary():
    with pytest.raises(ValueError, match="stop_token must be a token id in 0..63"):
        kvlib.generate_batch(tiny_model(torch.float64), [[1]], 5, stop_token=64)


def test_a_cache_of_another_batch_size_is_refused():
    model = tiny_model(torch.float64)
    with pytest.raises(ValueError, match="cache was built for batch size 1, ids have batch size 2"):
        kvlib.generate_batch(model, [[1], [2]], 3, cache=KVCache.for_model(model, max_len=8))
