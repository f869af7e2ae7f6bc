"""generate(): sampling, stopping, records, dtypes."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlib
from kvlib import Config, Decoder


@pytest.fixture
def model():
    return Decoder(Config.tiny()).eval()


def test_random_model_text_varies(model):
    # With a degenerate init a random model just repeats itself and token equality means little.
    assert len(set(kvlib.generate(model, [1, 2, 3], 20))) > 3


def test_seeded_sampling_is_repeatable(model):
    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return kvlib.generate(model, [1, 2, 3], 20, temperature=1.0, top_k=10, generator=g)
    assert run(5) == run(5)
    assert run(5) != run(6)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert (kvlib.generate(model, [4, 5], 15, temperature=0.8, generator=g1)
            == kvlib.generate(model, [4, 5], 15, temperature=0.8, generator=g2, use_cache=False))


def test_top_k_one_is_greedy(model):
    g = torch.Generator().manual_seed(0)
    assert (kvlib.generate(model, [1, 2, 3], 10, temperature=1.0, top_k=1, generator=g)
            == kvlib.generate(model, [1, 2, 3], 10))


def test_stop_token(model):
    full = kvlib.generate(model, [1, 2, 3], 20)
    stop = full[4]
    first = full.index(stop)
    assert kvlib.generate(model, [1, 2, 3], 20, stop_token=stop) == full[:first + 1]


def test_records(model):
    out = kvlib.generate(model, torch.tensor([1, 2, 3, 4]), 5, keep_logits=True)
    assert isinstance(out, kvlib.Generation)
    assert [r.context_len for r in out.records] == [4, 5, 6, 7, 8]
    assert out.logits.shape == (5, model.config.vocab_size)
    assert out.tokens == out.logits.argmax(-1).tolist()
    assert all(r.seconds > 0 for r in out.records)


def test_zero_new_tokens(model):
    assert kvlib.generate(model, [1], 0) == []


def test_progress_bar(model, capsys):
    kvlib.generate(model, [1, 2], 3, progress=True)
    assert "with cache" in capsys.readouterr().err


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-10), (torch.bfloat16, None)])
def test_other_dtypes(dtype, atol):
    model = Decoder(Config.tiny()).to(dtype).eval()
    ids = torch.randint(0, 64, (1, 9))
    cache = kvlib.KVCache.for_model(model)
    assert cache.dtype == dtype
    with torch.no_grad():
        full = model(ids)
        cached = torch.cat([model(ids[:, :4], cache), model(ids[:, 4:], cache)], dim=1)
    assert full.dtype == dtype
    if atol is not None:
        torch.testing.assert_close(cached, full, atol=atol, rtol=0)
    else:   # bfloat16 keeps ~3 significant digits: same ballpark, not the same bits
        assert (cached.float() - full.float()).abs().max() < 0.1 * full.float().abs().max()


def test_import_is_light():
    import subprocess, sys
    code = "import sys, kvlib; print(','.join(m for m in ('gguf', 'transformers', 'tokenizers', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = Decoder(Config.tiny()).eval()
    ids = [1, 2, 3, 4]
    cpu = kvlib.generate(model, ids, 10)
    assert kvlib.generate(model.cuda(), ids, 10) == cpu
    assert kvlib.generate(model.cuda(), ids, 10, use_cache=False) == cpu


# ------------------------------------------------------------------- sample: a pure function

def test_sample_greedy_is_the_argmax_of_each_row():
    logits = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(0))     # (batch, seq, vocab)
    assert torch.equal(kvlib.sample(logits), logits.argmax(-1))
    assert kvlib.sample(logits[0, 0]).shape == ()


def test_sample_is_repeatable_and_respects_top_k():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1))
    draw = lambda **kw: kvlib.sample(logits, temperature=1.0, generator=torch.Generator().manual_seed(7), **kw)
    assert torch.equal(draw(), draw())                                   # same generator state, same tokens
    assert torch.equal(draw(top_k=1), logits.argmax(-1))                 # top-1 sampling is greedy
    top3 = logits.topk(3, dim=-1).indices
    for _ in range(5):
        picked = kvlib.sample(logits, temperature=2.0, top_k=3)
        assert all(int(p) in top3[i].tolist() for i, p in enumerate(picked))
    before = logits.clone()
    kvlib.sample(logits, temperature=0.5, top_k=2)
    assert torch.equal(logits, before)                                   # the input is left as it was


@pytest.mark.parametrize("kwargs, message", [(dict(temperature=-1.0), "temperature must be >= 0"),
                                             (dict(top_k=0), "top_k must be a positive int"),
                                             (dict(top_k=True), "top_k must be a positive int")])
def test_sample_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kvlib.sample(torch.zeros(5), **kwargs)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), width=st.sampled_from([8, 64, 576]), scale=st.floats(0.01, 100.0),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 10_000))
def test_rms_norm_is_its_formula_bit_for_bit(rows, width, scale, dtype, seed):
    """RMSNorm runs as one fused operator; it must be the formula Llama writes out, to the bit
    (in bfloat16: normalised in float32, rounded, then scaled by the gain)."""
    from kvlib.model import RMSNorm

    g = torch.Generator().manual_seed(seed)
    norm = RMSNorm(width, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(width, generator=g))
    x = (torch.randn(2, rows, width, generator=g) * scale).to(dtype)
    xf = x.float()
    normalised = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
    expected = norm.weight * normalised.to(dtype) if dtype == torch.bfloat16 else normalised * norm.weight
    assert torch.equal(norm(x), expected)


def test_a_sampler_checks_its_settings_once_when_made():
    """Made with bad settings, a Sampler says so at once (the loops make one per call, not a check per token)."""
    from kvlib.generate import Sampler

    with pytest.raises(ValueError, match="temperature"):
        Sampler(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        Sampler(temperature=1.0, top_k=0)
