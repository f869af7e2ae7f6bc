"""kvlib.speculative: greedy speculative decoding writes kvlib.generate's tokens whatever the
draft; the sampling rule keeps the model's own distribution (a statistical test that fails for
the two wrong rules); rejected keys are rolled back out of the cache."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlib
from kvlib import Config, Decoder, speculative

from tiny_models import tiny_model

PROFILE = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OTHER = Decoder(Config.tiny()).double().eval()                 # another model of the same vocabulary, as a draft


@PROFILE
@given(prompt=st.lists(st.integers(0, 9), min_size=1, max_size=30), n=st.integers(0, 24), k=st.integers(1, 6),
       ngram=st.integers(1, 3), which=st.sampled_from(["prompt_lookup", "other", "same"]))
def test_greedy_speculative_decoding_writes_generates_tokens(prompt, n, k, ngram, which):
    """A small alphabet (ids 0-9) makes repeated n-grams, so prompt lookup drafts and is sometimes right."""
    model = tiny_model(torch.float64)
    draft = {"prompt_lookup": "prompt_lookup", "other": OTHER, "same": model}[which]
    out = speculative.generate(model, prompt, n, draft=draft, k=k, ngram=ngram)
    assert out == kvlib.generate(model, prompt, n)
    assert isinstance(out, kvlib.Generation) and len(out) == n
    assert all(r.accepted <= r.drafted <= k for r in out.records)


def test_a_model_drafting_for_itself_is_always_right():
    model = tiny_model(torch.float64)
    out = speculative.generate(model, [1, 2, 3], 20, draft=model, k=4)
    steps = out.records[1:]
    assert all(r.accepted == r.drafted for r in steps) and len(steps) == 4     # 1 + 4 × (4 + 1) = 21 >= 20


def test_it_stops_after_the_stop_token():
    model = tiny_model(torch.float64)
    free = kvlib.generate(model, [4, 5, 6], 20)
    stop = free[7]
    assert speculative.generate(model, [4, 5, 6], 20, stop_token=stop) == free[:free.index(stop) + 1]


def test_rejected_keys_are_rolled_back(monkeypatch):
    """Without the rollback the cache keeps the keys of rejected drafts, and the text changes."""
    model = tiny_model(torch.float64)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3, 9, 1, 2]
    wrong = speculative.generate(model, prompt, 20, draft=OTHER, k=4)
    assert wrong == kvlib.generate(model, prompt, 20)
    monkeypatch.setattr(kvlib.KVCache, "truncate", lambda self, n: None)
    try:                                            # the rejected keys stay, at the positions of later tokens
        caught = speculative.generate(model, prompt, 20, draft=OTHER, k=4) != kvlib.generate(model, prompt, 20)
    except ValueError as err:                       # or the cache overflows with them
        caught = "KV cache is full" in str(err)
    assert caught


def test_prompt_lookup_finds_the_most_recent_occurrence():
    assert speculative.lookup_draft([5, 1, 2, 7, 8, 1, 2, 9, 3, 1, 2], 3, 2) == [9, 3, 1]
    assert speculative.lookup_draft([1, 2, 3], 4, 2) == []
    assert speculative.lookup_draft([4, 4], 4, 1) == [4]


# ------------------------------------------------------------------- sampling without bias

P = torch.tensor([0.5, 0.2, 0.2, 0.1])      # the model's distribution
Q = torch.tensor([0.1, 0.2, 0.3, 0.4])      # the drafter's: wrong on purpose


def always_accept(drafts, p, q, generator, greedy):
    return drafts + [int(torch.multinomial(p[len(drafts)], 1, generator=generator))]


def resample_from_p(drafts, p, q, generator, greedy):
    d = drafts[0]
    if torch.rand((), generator=generator) < min(1.0, float(p[0, d] / q[0, d])):
        return [d]
    return [int(torch.multinomial(p[0], 1, generator=generator))]


def first_tokens(rule, n=20_000, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(4)
    p = torch.stack([P, P])
    for _ in range(n):
        d = int(torch.multinomial(Q, 1, generator=g))
        counts[rule([d], p, Q[None], g, False)[0]] += 1
    return counts


def chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor, df: int | None = None) -> float:
    """Pearson's chi-square test of ``counts`` against the probabilities (or counts) ``expected``:
    the probability of a statistic this large if the counts were drawn from ``expected``."""
    expected = expected.double() * counts.sum() / expected.sum()
    stat = ((counts.double() - expected) ** 2 / expected).sum()
    df = counts.numel() - 1 if df is None else df
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def test_the_acceptance_rule_keeps_the_models_distribution():
    assert chi_square_p_value(first_tokens(speculative.accept), P) > 1e-3


@pytest.mark.parametrize("rule", [always_accept, resample_from_p], ids=["always accept", "resample from p"])
def test_the_wrong_rules_are_caught(rule):
    assert chi_square_p_value(first_tokens(rule), P) < 1e-6


def test_sampled_speculative_decoding_follows_plain_sampling():
    """Over many draws, the first two new tokens of speculative sampling are distributed as plain
    sampling's (a tiny model at temperature 2 spreads them over a few tokens)."""
    model = tiny_model(torch.float64)
    g = torch.Generator().manual_seed(1)
    pairs = {"plain": [], "speculative": []}
    for _ in range(400):
        pairs["plain"].append(tuple(kvlib.generate(model, [1, 2, 3], 2, temperature=2.0, top_k=3, generator=g)))
        pairs["speculative"].append(tuple(speculative.generate(model, [1, 2, 3], 2, draft=OTHER, k=2,
                                                               temperature=2.0, top_k=3, generator=g)))
    seen = sorted(set(pairs["plain"]) | set(pairs["speculative"]))
    table = torch.tensor([[pairs[name].count(x) for x in seen] for name in pairs], dtype=torch.float64)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()     # independence
    assert chi_square_p_value(table.flatten(), expected.flatten(), df=len(seen) - 1) > 1e-3


# ------------------------------------------------------------------- clear errors

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(k=0), ValueError, "k must be a positive int"),
    (dict(ngram=0), ValueError, "ngram must be a positive int"),
    (dict(draft="medusa"), ValueError, "unknown draft 'medusa'"),
    (dict(draft=Decoder(Config(vocab_size=32, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_mlp=32))),
     ValueError, "vocabulary has 32 tokens, the model's 64"),
    (dict(draft=3), TypeError, "draft must be 'prompt_lookup' or a kvlib.Decoder"),
    (dict(temperature=-1.0), ValueError, "temperature must be >= 0"),
])
def test_bad_input_is_refused_clearly(kwargs, error, message):
    with pytest.raises(error, match=message):
        speculative.generate(tiny_model(torch.float64), [1, 2], 4, **kwargs)
