"""kvlib.measure.flops: the closed-form counts equal what PyTorch's FLOP counter counts, call by call."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import kvlib
from kvlib.attention import causal_attention
from kvlib.measure.flops import (attention_flops_per_pair, count_step_flops, crossover_context, generation_flops,
                         generation_ratio, generation_step_flops, linear_flops_per_token, output_flops_per_row,
                         step_call, step_flops)
from kvlib.measure import count_flops

CONFIGS = {
    "tiny (GQA, 2 layers)": kvlib.Config.tiny(),
    "multi-head": kvlib.Config(vocab_size=50, d_model=48, n_layers=2, n_heads=6, n_kv_heads=6, d_mlp=80,
                               max_seq_len=64),
    "multi-query, 1 layer": kvlib.Config(vocab_size=40, d_model=32, n_layers=1, n_heads=4, n_kv_heads=1,
                                         d_mlp=48, max_seq_len=64),
}


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def model(request):
    torch.manual_seed(0)
    return kvlib.Decoder(CONFIGS[request.param]).eval()


def _ids(cfg, n, seed=0):
    return torch.randint(0, cfg.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n", [1, 2, 7, 33])
@pytest.mark.parametrize("last_only", [True, False])
def test_uncached_step_matches_the_counter(model, n, last_only):
    cfg = model.config
    ids = _ids(cfg, n)
    counted = count_flops(lambda: model(ids, last_only=last_only))
    assert step_flops(cfg, n, n, last_only=last_only).total == counted


@pytest.mark.parametrize("n", [1, 2, 9, 40])
def test_cached_step_matches_the_counter(model, n):
    cfg = model.config
    assert count_step_flops(model, n, use_cache=True) == step_flops(cfg, n, 1).total
    assert count_step_flops(model, n, use_cache=False) == step_flops(cfg, n, n).total


@pytest.mark.parametrize("stored, chunk", [(0, 5), (4, 1), (4, 3), (10, 7)])
def test_prefill_chunk_after_cached_tokens_matches_the_counter(model, stored, chunk):
    cfg = model.config
    ids = _ids(cfg, stored + chunk)
    cache = kvlib.KVCache.for_model(model)
    with torch.no_grad():
        if stored:
            model(ids[:, :stored], cache)
    counted = count_flops(lambda: model(ids[:, stored:], cache))    # every position's logits
    assert counted == step_flops(cfg, stored + chunk, chunk, last_only=False).total


def test_batch_multiplies_everything(model):
    cfg = model.config
    ids = torch.cat([_ids(cfg, 6, 0), _ids(cfg, 6, 1), _ids(cfg, 6, 2)])
    assert count_flops(lambda: model(ids, last_only=True)) == step_flops(cfg, 6, 6, batch=3).total


def test_parts_are_what_they_say(model):
    """Split the counter's total by module: projections+MLP, attention, output layer."""
    cfg = model.config
    n = 12
    ids = _ids(cfg, n)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(ids, last_only=True)
    by_op = counter.get_flop_counts()["Global"]
    # The stock counter sees only the matrix products on a CPU: the linear part and the output.
    s = step_flops(cfg, n, n)
    assert sum(by_op.values()) in (s.linear + s.output, s.total)
    assert s.linear == n * linear_flops_per_token(cfg)
    assert s.attention == n * n * attention_flops_per_pair(cfg)
    assert s.output == output_flops_per_row(cfg)


def test_attention_formula_matches_the_written_out_attention():
    """The counter's formula for the fused kernel agrees with counting the plain matmuls of
    kvlib.attention.causal_attention (which the stock FlopCounterMode counts as bmm)."""
    cfg = kvlib.Config.tiny()
    g = torch.Generator().manual_seed(0)
    for q_len, k_len in [(1, 9), (5, 5), (3, 11)]:
        q = torch.randn(2, cfg.n_heads, q_len, cfg.head_dim, generator=g)
        k = torch.randn(2, cfg.n_kv_heads, k_len, cfg.head_dim, generator=g)
        v = torch.randn(2, cfg.n_kv_heads, k_len, cfg.head_dim, generator=g)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            causal_attention(q, k, v)
        per_layer_pair = attention_flops_per_pair(cfg) // cfg.n_layers
        assert counter.get_total_flops() == 2 * q_len * k_len * per_layer_pair
        fused = count_flops(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)))
        assert fused == counter.get_total_flops()


def test_generation_totals_match_the_counter_and_the_steps(model):
    cfg = model.config
    prompt = _ids(cfg, 5)[0].tolist()
    for use_cache in (False, True):
        steps = generation_step_flops(cfg, 5, 9, use_cache=use_cache)
        assert len(steps) == 9
        assert [s.context_len for s in steps] == list(range(5, 14))
        assert [s.tokens_in for s in steps] == (list(range(5, 14)) if not use_cache else [5] + [1] * 8)
        total = generation_flops(cfg, 5, 9, use_cache=use_cache)
        assert total == sum(s.total for s in steps)
        counted = count_flops(lambda: kvlib.generate(model, prompt, 9, use_cache=use_cache))
        assert counted == total


def test_uncached_grows_quadratically_cached_linearly():
    cfg = kvlib.Config.small()
    a, b, o = linear_flops_per_token(cfg), attention_flops_per_pair(cfg), output_flops_per_row(cfg)
    for n in (1, 64, 1000, 2048):
        assert step_flops(cfg, n, n).total == o + a * n + b * n * n
        assert step_flops(cfg, n, 1).total == o + a + b * n
    # second differences: constant (2b) without the cache, zero with it
    un = [step_flops(cfg, n, n).total for n in (100, 101, 102)]
    ca = [step_flops(cfg, n, 1).total for n in (100, 101, 102)]
    assert un[2] - 2 * un[1] + un[0] == 2 * b
    assert ca[2] - 2 * ca[1] + ca[0] == 0


def test_crossover_closed_form():
    for cfg in (kvlib.Config.small(), kvlib.Config.smollm2_135m(), kvlib.Config.tiny()):
        n_star = crossover_context(cfg)
        assert n_star == cfg.d_model + cfg.n_kv_heads * cfg.head_dim + 1.5 * cfg.d_mlp
        s = step_flops(cfg, int(n_star), int(n_star))
        if n_star == int(n_star):
            assert s.attention == s.linear
    assert crossover_context(kvlib.Config.small()) == 1440
    assert crossover_context(kvlib.Config.smollm2_135m()) == 3072


def test_ratio_for_2048_tokens_smollm2_shapes():
    """The article's '2,048 tokens': only the structure is asserted, not a figure."""
    cfg = kvlib.Config.smollm2_135m()
    n = 2048
    a, b, o = linear_flops_per_token(cfg), attention_flops_per_pair(cfg), output_flops_per_row(cfg)
    un = generation_flops(cfg, 1, n, use_cache=False)
    ca = generation_flops(cfg, 1, n, use_cache=True)
    contexts = range(1, n + 1)
    assert un == sum(o + a * m + b * m * m for m in contexts)
    assert ca == (o + a + b) + sum(o + a + b * m for m in contexts[1:])
    ratio = generation_ratio(cfg, n)
    assert ratio == un / ca
    assert 1 < ratio < 2 * n / 3
    # every position's logits (a plain forward pass without last_only) costs more without the cache
    assert generation_ratio(cfg, n, last_only=False) > ratio


def test_step_call_is_repeatable():
    torch.manual_seed(0)
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    fn = step_call(model, 20, use_cache=True)
    first, second = fn(), fn()
    assert torch.equal(first, second)
    # and the cached step gives the same logits as feeding the whole context
    full = step_call(model, 20, use_cache=False)()
    torch.testing.assert_close(first, full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [dict(context_len=0, tokens_in=1), dict(context_len=3, tokens_in=4),
                                 dict(context_len=2.0, tokens_in=1)])
def test_step_flops_rejects_bad_arguments(bad):
    with pytest.raises(ValueError):
        step_flops(kvlib.Config.tiny(), **bad)
