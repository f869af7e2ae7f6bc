"""The price is memory: the size formula, published shapes, the sliding-window, int8 and paged caches."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlib
from kvlib import Config, Decoder, Int8KVCache, KVCache, SlidingWindowKVCache, kv_cache_bytes
from kvlib.attention import banded_mask, causal_attention
from kvlib.measure import peak_memory
from kvlib.cache import bytes_per_number, crossover_tokens, kv_bytes_per_token, weight_bytes
from kvlib.cache import MLA_SHAPES, MODEL_SHAPES, MLAShape, count_parameters, model_shape
from kvlib.cache import (Occupancy, RequestLengths, occupancy, blocks_for, per_request_occupancy,
                          reserved_slots, sample_requests)
from kvlib.cache import dequantize_int8, quantize_int8

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# =============================================================== the size formula

@pytest.mark.parametrize("cfg", [Config.tiny(), Config.small(),
                                 Config(vocab_size=10, d_model=24, n_layers=3, n_heads=6, n_kv_heads=6,
                                        d_mlp=8, max_seq_len=64),
                                 Config(vocab_size=10, d_model=32, n_layers=1, n_heads=4, n_kv_heads=1,
                                        d_mlp=8, max_seq_len=64)], ids=["tiny", "small", "mha", "mqa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("batch, seq_len", [(1, 1), (1, 37), (3, 64)])
def test_formula_equals_the_buffers_of_a_real_cache(cfg, dtype, batch, seq_len):
    cache = KVCache(cfg.n_layers, batch, cfg.n_kv_heads, seq_len, cfg.head_dim, dtype=dtype)
    assert kv_cache_bytes(cfg, seq_len, batch, dtype) == cache.nbytes
    assert kv_cache_bytes(cfg, seq_len, batch, bytes_per_number(dtype)) == cache.nbytes


def test_formula_for_smollm2_shapes_and_for_model():
    cfg = Config.smollm2_135m()
    assert kv_bytes_per_token(cfg, torch.float32) == 2 * 30 * 3 * 64 * 4 == 46_080
    model = Decoder(Config.tiny())
    cache = KVCache.for_model(model, batch=2, max_len=50)
    assert kv_cache_bytes(model.config, 50, 2) == cache.nbytes


def test_bytes_per_number_and_bad_arguments():
    assert [bytes_per_number(d) for d in (torch.float32, torch.float16, torch.bfloat16, torch.int8, 3)] == [4, 2, 2, 1, 3]
    with pytest.raises(ValueError):
        kv_cache_bytes(Config.tiny(), -1)
    with pytest.raises(ValueError):
        kv_cache_bytes(Config.tiny(), 4, batch=0)
    with pytest.raises(TypeError):
        bytes_per_number("float16")
    assert kv_cache_bytes(Config.tiny(), 0) == 0


# =============================================================== published shapes

def test_published_shapes():
    expected = {  # layers, query heads, kv heads, head dim (config.json of each model)
        "SmolLM2-135M": (30, 9, 3, 64), "Llama-2-7B": (32, 32, 32, 128), "Llama-3-8B": (32, 32, 8, 128),
        "Mistral-7B": (32, 32, 8, 128), "Llama-3-70B": (80, 64, 8, 128)}
    assert {n: (s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim) for n, s in MODEL_SHAPES.items()} == expected
    for shape in MODEL_SHAPES.values():
        assert shape.source.startswith("https://huggingface.co/") and shape.source.endswith("config.json")
        assert count_parameters(shape.config, shape.tied_embeddings) == shape.n_params
    assert MODEL_SHAPES["SmolLM2-135M"].config == Config.smollm2_135m()
    with pytest.raises(KeyError, match="known"):
        model_shape("GPT-5")


def test_parameter_count_equals_a_kvlib_decoder_of_smollm2_shapes():
    with torch.device("meta"):
        model = Decoder(Config.smollm2_135m())
    assert model.num_parameters() == MODEL_SHAPES["SmolLM2-135M"].n_params == 134_515_008


def test_bytes_per_token_of_published_models():
    per_token = {n: kv_bytes_per_token(s, torch.float16) for n, s in MODEL_SHAPES.items()}
    assert per_token == {"SmolLM2-135M": 23_040, "Llama-2-7B": 524_288, "Llama-3-8B": 131_072,
                         "Mistral-7B": 131_072, "Llama-3-70B": 327_680}


def test_multi_head_latent_attention_caches_the_latent_and_the_rotated_key():
    """DeepSeek-V3 (config.json: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64): per token and
    layer one latent of 512 numbers and one rotated key of 64, whatever its 128 heads."""
    s = MLA_SHAPES["DeepSeek-V3"]
    assert (s.n_layers, s.n_heads, s.kv_lora_rank, s.qk_rope_head_dim, s.qk_nope_head_dim, s.v_head_dim) == \
        (61, 128, 512, 64, 128, 128)
    assert s.source == "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json"
    assert kv_bytes_per_token(s, torch.bfloat16) == (512 + 64) * 61 * 2 == 70_272
    assert kv_bytes_per_token(s, torch.float32) == (512 + 64) * 61 * 4
    assert kv_bytes_per_token(s, 1) == s.latent_numbers_per_token == 35_136
    assert kv_cache_bytes(s, 4096, 8, torch.float16) == 70_272 * 4096 * 8
    # the same heads as separate keys (128 + 64 numbers) and values (128): 71 times the latent
    assert s.head_numbers_per_token * 2 == 61 * 128 * (128 + 64 + 128) * 2 == 4_997_120
    assert round(s.head_numbers_per_token / s.latent_numbers_per_token) == 71
    # half of Llama-3-8B's GQA cache per token, for a model eighty times its size
    assert kv_bytes_per_token(s, torch.float16) < kv_bytes_per_token(MODEL_SHAPES["Llama-3-8B"], torch.float16)


@settings(**SETTINGS)
@given(layers=st.integers(1, 100), rank=st.integers(1, 1024), rope=st.integers(0, 128), nbytes=st.integers(1, 8),
       tokens=st.integers(0, 5000), batch=st.integers(1, 16))
def test_latent_formula_for_any_shape(layers, rank, rope, nbytes, tokens, batch):
    s = MLAShape("x", n_layers=layers, n_heads=8, kv_lora_rank=rank, qk_rope_head_dim=rope, qk_nope_head_dim=16,
                 v_head_dim=16, max_context=4096, n_params=1, source="")
    assert kv_bytes_per_token(s, nbytes) == (rank + rope) * layers * nbytes
    assert kv_cache_bytes(s, tokens, batch, nbytes) == (rank + rope) * layers * nbytes * tokens * batch


def test_latent_shapes_are_apart_from_the_llama_style_ones():
    """MODEL_SHAPES stays Llama-style (every entry a Config a Decoder is built from: the widgets and
    the levers use them so); model_shape finds either kind."""
    assert not set(MLA_SHAPES) & set(MODEL_SHAPES)
    assert model_shape("DeepSeek-V3") is MLA_SHAPES["DeepSeek-V3"]
    assert model_shape("Llama-3-8B") is MODEL_SHAPES["Llama-3-8B"]
    with pytest.raises(KeyError, match="DeepSeek-V3"):
        model_shape("GPT-5")


@pytest.mark.parametrize("name", list(MODEL_SHAPES))
@pytest.mark.parametrize("batch", [1, 8])
def test_crossover_is_where_the_cache_outweighs_the_weights(name, batch):
    s = MODEL_SHAPES[name]
    x = crossover_tokens(s.config, s.n_params, batch)
    w = weight_bytes(s.n_params, torch.float16)
    assert kv_cache_bytes(s.config, math.floor(x), batch, torch.float16) <= w
    assert kv_cache_bytes(s.config, math.floor(x) + 1, batch, torch.float16) > w


# =============================================================== sliding window: masks and attention

def banded_reference(q, k, v, window, sinks=0):
    """Written out with loops: query i (the last q_len of k_len positions) attends to keys
    j with i_abs - window < j <= i_abs, and to the first ``sinks`` keys up to i_abs."""
    b, h, q_len, d = q.shape
    k_len = k.shape[2]
    group = h // k.shape[1]
    out = torch.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            kh, vh = k[bi, hi // group], v[bi, hi // group]
            for i in range(q_len):
                pos = k_len - q_len + i
                seen = sorted(set(range(max(0, pos - window + 1), pos + 1)) | set(range(min(sinks, pos + 1))))
                scores = kh[seen] @ q[bi, hi, i] / math.sqrt(d)
                out[bi, hi, i] = scores.softmax(dim=-1) @ vh[seen]
    return out


@pytest.mark.parametrize("q_len, k_len, window", [(5, 5, 1), (5, 5, 2), (6, 6, 3), (3, 9, 4), (1, 9, 4),
                                                   (4, 4, 4), (4, 4, 10), (2, 7, 7)])
def test_banded_mask(q_len, k_len, window):
    mask = banded_mask(q_len, k_len, window)
    for i in range(q_len):
        pos = k_len - q_len + i
        assert mask[i].tolist() == [pos - window < j <= pos for j in range(k_len)]
    with pytest.raises(ValueError):
        banded_mask(2, 2, 0)


@pytest.mark.parametrize("q_len, k_len, window, sinks", [(9, 9, 3, 1), (9, 9, 3, 4), (3, 9, 2, 2), (1, 12, 4, 4),
                                                         (5, 5, 2, 10)])
def test_banded_mask_with_sinks(q_len, k_len, window, sinks):
    mask = banded_mask(q_len, k_len, window, sinks=sinks)
    for i in range(q_len):
        pos = k_len - q_len + i
        assert mask[i].tolist() == [(pos - window < j or j < sinks) and j <= pos for j in range(k_len)]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="sinks"):
            banded_mask(2, 2, 1, sinks=bad)


@pytest.mark.parametrize("window, sinks", [(1, 1), (3, 2), (4, 4), (20, 3)])
def test_model_with_sinks_equals_the_written_out_band(model64, window, sinks):
    ids = torch.randint(0, model64.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(window))
    torch.testing.assert_close(model64(ids, window=window, sinks=sinks),
                               reference_logits(model64, ids, window, sinks))
    if window < ids.shape[1]:   # the window has moved past the first tokens: the sinks change what is seen
        assert not torch.allclose(model64(ids, window=window, sinks=sinks)[:, -1], model64(ids, window=window)[:, -1])


def test_sinks_need_a_window_and_no_cache(model64):
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="window=W too"):
        model64(ids, sinks=2)
    with pytest.raises(ValueError, match="without a cache"):
        model64(ids, KVCache.for_model(model64, max_len=8), window=2, sinks=2)


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8, 11, 12, 50])
@pytest.mark.parametrize("q_len", [1, 4, 11])
def test_windowed_attention_equals_the_written_out_band(window, q_len):
    g = torch.Generator().manual_seed(window * 100 + q_len)
    q = torch.randn(2, 4, q_len, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 11, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 11, 8, generator=g, dtype=torch.float64)
    expected = banded_reference(q, k, v, window)
    torch.testing.assert_close(causal_attention(q, k, v, window=window), expected)
    mask = banded_mask(q_len, 11, window)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(fused, expected)
    if window >= 11:               # a window at least as long as the text: plain causal attention
        torch.testing.assert_close(causal_attention(q, k, v, window=window), causal_attention(q, k, v))


# =============================================================== sliding window: the model

def reference_logits(model: Decoder, ids: torch.Tensor, window: int, sinks: int = 0) -> torch.Tensor:
    """The decoder, uncached, with the written-out banded attention in every layer."""
    x = model.embed(ids)
    b, t, _ = x.shape
    for blk in model.blocks:
        a, h = blk.attn, blk.attn_norm(x)
        q = a.wq(h).view(b, t, a.n_heads, a.head_dim).transpose(1, 2)
        k = a.wk(h).view(b, t, a.n_kv_heads, a.head_dim).transpose(1, 2)
        v = a.wv(h).view(b, t, a.n_kv_heads, a.head_dim).transpose(1, 2)
        q, k = model.rope(q, 0), model.rope(k, 0)
        out = banded_reference(q, k, v, window, sinks)
        x = x + a.wo(out.transpose(1, 2).reshape(b, t, a.n_heads * a.head_dim))
        x = x + blk.mlp(blk.mlp_norm(x))
    return F.linear(model.norm(x), model.embed.weight)


def windowed_cached_logits(model, ids, window, split, chunk):
    cache = SlidingWindowKVCache.for_model(model, batch=ids.shape[0], window=window)
    parts = [model(ids[:, :split], cache)]
    for start in range(split, ids.shape[1], chunk):
        parts.append(model(ids[:, start:start + chunk], cache))
    assert cache.pos == ids.shape[1]
    return torch.cat(parts, dim=1)


@pytest.fixture(scope="module")
def model64():
    torch.manual_seed(0)
    return Decoder(Config.tiny()).to(torch.float64).eval()


@pytest.mark.parametrize("window", [1, 2, 3, 5, 8, 16, 24, 100])
@pytest.mark.parametrize("split, chunk", [(1, 1), (7, 1), (20, 3), (24, 1)])
def test_sliding_window_cache_equals_the_banded_reference(model64, window, split, chunk):
    ids = torch.randint(0, model64.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(window))
    with torch.no_grad():
        expected = reference_logits(model64, ids, window)
        torch.testing.assert_close(windowed_cached_logits(model64, ids, window, split, chunk), expected,
                                   atol=1e-10, rtol=0)
        torch.testing.assert_close(model64(ids, window=window), expected, atol=1e-10, rtol=0)
        full = model64(ids)
    # inside the window nothing has been dropped yet: the same as plain full attention
    inside = min(window, ids.shape[1])
    torch.testing.assert_close(expected[:, :inside], full[:, :inside], atol=1e-10, rtol=0)
    if window >= ids.shape[1]:
        torch.testing.assert_close(expected, full, atol=1e-10, rtol=0)
    else:
        assert not torch.allclose(expected[:, window:], full[:, window:])   # the window does change later positions


@st.composite
def window_cases(draw):
    n_kv = draw(st.sampled_from([1, 2]))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([2, 4]))
    cfg = Config(vocab_size=draw(st.integers(8, 40)), d_model=n_heads * head_dim, n_layers=draw(st.integers(1, 2)),
                 n_heads=n_heads, n_kv_heads=n_kv, d_mlp=16, max_seq_len=32)
    seq = draw(st.integers(1, 20))
    return (cfg, draw(st.integers(0, 2**16)), draw(st.integers(1, 3)), seq, draw(st.integers(1, seq)),
            draw(st.integers(1, 5)), draw(st.integers(1, 24)))


@settings(max_examples=60, **SETTINGS)
@given(window_cases())
def test_sliding_window_property(case):
    cfg, seed, batch, seq, split, chunk, window = case
    torch.manual_seed(seed)
    model = Decoder(cfg).to(torch.float64).eval()     # float64: differences are the code's, not rounding's
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    with torch.no_grad():
        expected = model(ids, window=window)
        torch.testing.assert_close(windowed_cached_logits(model, ids, window, split, chunk), expected,
                                   atol=1e-10, rtol=0)


def test_generate_with_a_sliding_window_cache(model64):
    prompt = list(range(1, 6))
    window = 6
    cache = SlidingWindowKVCache.for_model(model64, window=window)
    out = kvlib.generate(model64, prompt, 30, cache=cache, keep_logits=True)
    assert cache.pos == len(prompt) + 30 - 1          # the last token is chosen, not yet fed
    ids = torch.tensor([prompt + out.tokens[:-1]])
    with torch.no_grad():
        banded = model64(ids, window=window)[0, len(prompt) - 1:]
    torch.testing.assert_close(out.logits, banded.float(), atol=1e-6, rtol=0)
    assert out.tokens == [int(i) for i in banded.argmax(-1)]
    # a window longer than the whole text gives exactly the full cache's tokens
    full = kvlib.generate(model64, prompt, 30)
    assert kvlib.generate(model64, prompt, 30, cache=SlidingWindowKVCache.for_model(model64, window=64)) == full


def test_ring_buffer_memory_stays_flat():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    sizes = {SlidingWindowKVCache.for_model(model, window=8).nbytes for _ in range(2)}
    assert sizes == {kv_cache_bytes(model.config, 8)}
    prompt = [1, 2, 3, 4]

    def windowed(n):
        return peak_memory(lambda: kvlib.generate(model, prompt, n,
                                                  cache=SlidingWindowKVCache.for_model(model, window=8)))

    def full(n):
        return peak_memory(lambda: kvlib.generate(model, prompt, n))

    w = [windowed(n) for n in (12, 24, 40)]
    f = [full(n) for n in (12, 24, 40)]
    assert w[0] == w[1] == w[2]                       # independent of the tokens generated
    assert f[0] < f[1] < f[2]                         # the full cache grows with them
    assert f[2] - f[0] >= kv_cache_bytes(model.config, 40 - 12)
    cache = SlidingWindowKVCache.for_model(model, window=8)
    before = cache.nbytes
    kvlib.generate(model, prompt, 100, cache=cache)
    assert cache.nbytes == before and cache.pos == 103


def test_sliding_window_cache_errors_and_repr():
    with pytest.raises(ValueError, match="window"):
        SlidingWindowKVCache(2, 1, 2, 0, 8)
    c = SlidingWindowKVCache(2, 1, 2, 16, 8)
    assert "window=16" in repr(c) and c.dtype == torch.float32


# =============================================================== int8

@pytest.mark.parametrize("shape", [(4,), (2, 3, 7, 16), (1, 1, 1, 64)])
@pytest.mark.parametrize("spread", [1e-3, 1.0, 300.0])
def test_int8_round_trip_error_is_at_most_half_a_step(shape, spread):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * spread
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and q.shape == x.shape and scale.shape == shape[:-1] + (1,)
    assert int(q.abs().max()) == 127
    err = (x - dequantize_int8(q, scale)).abs()
    assert (err <= scale / 2 * (1 + 1e-5) + 1e-12).all()


def test_int8_zero_vector_and_extremes():
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, -1.0, 0.5]])
    q, scale = quantize_int8(x)
    assert scale[0, 0] == 0 and q[0].tolist() == [0, 0, 0]
    assert q[1].tolist() == [127, -127, 64]
    assert torch.equal(dequantize_int8(q, scale)[0], torch.zeros(3))


@pytest.mark.parametrize("cfg", [Config.tiny(), Config.smollm2_135m()], ids=["tiny", "smollm2"])
def test_int8_cache_memory(cfg):
    cache = Int8KVCache(cfg.n_layers, 2, cfg.n_kv_heads, 32, cfg.head_dim)
    numbers = kv_cache_bytes(cfg, 32, 2, torch.int8)
    scales = 2 * cfg.n_layers * cfg.n_kv_heads * 32 * 2 * 4          # one float32 per stored vector
    assert cache.nbytes == numbers + scales
    full = KVCache(cfg.n_layers, 2, cfg.n_kv_heads, 32, cfg.head_dim).nbytes
    assert cache.nbytes / full == pytest.approx((cfg.head_dim + 4) / (4 * cfg.head_dim))
    assert cache.dtype == torch.float32 and "int8" in repr(cache)


def test_int8_cache_is_close_to_the_float_cache():
    torch.manual_seed(0)
    model = Decoder(Config.small()).eval()
    prompt = torch.randint(0, model.config.vocab_size, (12,)).tolist()
    exact = kvlib.generate(model, prompt, 20, keep_logits=True)
    int8 = kvlib.generate(model, prompt, 20, cache=Int8KVCache.for_model(model, max_len=32), keep_logits=True)
    diff = (exact.logits - int8.logits).abs().max()
    assert 0 < diff < 0.1 * exact.logits.abs().max()
    # the stored numbers are within half a step of what a float cache stores
    ids = torch.tensor([prompt])
    c8, c32 = Int8KVCache.for_model(model, max_len=12), KVCache.for_model(model, max_len=12)
    with torch.no_grad():
        model(ids, c8)
        model(ids, c32)
    layer8, layer32 = c8.layers[0], c32.layers[0]      # (later layers see the first one's rounding)
    err = (dequantize_int8(layer8.k, layer8.k_scale) - layer32.k).abs()
    assert (err <= layer8.k_scale / 2 * (1 + 1e-5) + 1e-7).all()


def test_int8_cache_in_float64_and_errors():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).to(torch.float64).eval()
    cache = Int8KVCache.for_model(model)
    assert cache.dtype == torch.float64
    kvlib.generate(model, [1, 2, 3], 5, cache=cache)
    with pytest.raises(ValueError, match="floating-point"):
        Int8KVCache(1, 1, 1, 4, 4, dtype=torch.int8)


# =============================================================== paging

@pytest.fixture(scope="module")
def requests():
    return sample_requests(400, seed=1)


def test_sampled_requests_are_seeded_and_bounded(requests):
    assert requests == sample_requests(400, seed=1)
    assert requests != sample_requests(400, seed=2)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.total <= 2048 for r in requests)
    assert len({r.total for r in requests}) > 100           # a spread, not one length


def test_contiguous_waste_is_reserved_minus_used(requests):
    for over in ("end", "lifetime"):
        occ = occupancy(requests, "contiguous", over=over)
        steps = len(requests) if over == "end" else sum(r.output_len for r in requests)
        assert occ.reserved == steps * 2048
        assert occ.wasted == occ.reserved - occ.used
    end = occupancy(requests, "contiguous", over="end")
    assert end.used == sum(r.total for r in requests) and end.future == 0


@pytest.mark.parametrize("block_size", [1, 7, 16, 64])
def test_paged_waste_is_under_one_block_per_request(requests, block_size):
    for r, occ in zip(requests, per_request_occupancy(requests, "paged", block_size=block_size, over="end")):
        assert 0 <= occ.wasted < block_size
        assert occ.reserved == blocks_for(r.total, block_size) * block_size
    for r, occ in zip(requests, per_request_occupancy(requests, "paged", block_size=block_size)):
        assert occ.wasted < block_size * r.output_len           # under a block at every step
    if block_size == 1:
        assert occupancy(requests, "paged", block_size=1).wasted == 0
    assert (occupancy(requests, "paged", block_size=block_size).waste_fraction
            < occupancy(requests, "contiguous").waste_fraction)


def test_paging_helpers():
    assert [blocks_for(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]
    assert reserved_slots(17, "paged", block_size=16) == 32 and reserved_slots(17, "contiguous") == 2048
    with pytest.raises(ValueError):
        reserved_slots(3000, "contiguous")
    with pytest.raises(ValueError):
        reserved_slots(3, "buddy")
    r = RequestLengths(prompt_len=3, output_len=2)
    assert list(r.lengths()) == [4, 5]
    # at 4 tokens of 5 with blocks of 4: 4 used, nothing empty; at 5: 5 used, 3 never used
    assert per_request_occupancy([r], "paged", block_size=4) == [Occupancy(9, 0, 3)]
    # contiguous (max_len 8): at 4 tokens, 1 slot for the future and 3 never used; at 5, 3 never used
    assert per_request_occupancy([r], "contiguous", max_len=8) == [Occupancy(9, 1, 6)]


# =============================================================== the calculator widget

@pytest.fixture(scope="module")
def calculator():
    from ipywidgets.widgets.widget import _instances

    from kvlib.widgets import memory_calculator_widget

    before = set(_instances)
    yield memory_calculator_widget(start=("Llama-3-8B", 32_768, 8, "float16 / bfloat16"))
    for key in set(_instances) - before:      # close its ~900 widgets: other tests measure what is alive
        _instances[key].close()


def test_calculator_is_nested_stacks_linked_to_the_controls(calculator):
    import ipywidgets as widgets
    from ipywidgets.widgets.widget_link import Link

    box = calculator
    assert len(box.views) == 5 * 8 * 3 * 3 and all(isinstance(v, widgets.HTML) for v in box.views.values())
    assert len({v.value for v in box.views.values()}) == len(box.views)
    # following each Stack's selected child from the top reaches the view of the start choice
    shown = box.stack
    while isinstance(shown, widgets.Stack):
        shown = shown.children[shown.selected_index]
    assert shown is box.views[("Llama-3-8B", 32_768, 8, "float16 / bfloat16")]
    view = shown.value
    assert "Llama-3-8B" in view and "32,768 tokens × batch 8" in view
    assert f"{kv_cache_bytes(MODEL_SHAPES['Llama-3-8B'].config, 32_768, 8, torch.float16):,} bytes" in view
    # every Stack is jslink-ed to exactly one control, index -> selected_index; the slider drives the top one
    links = [l for l in box.links if isinstance(l, Link)]
    assert all(l.source[1] == "index" and l.target[1] == "selected_index" for l in links)
    controls = {l.target[0].model_id: l.source[0] for l in links}
    assert len(controls) == len(links) == 1 + 8 + 8 * 3 + 8 * 3 * 3
    assert controls[box.stack.model_id] is box.context
    assert {c.model_id for c in controls.values()} == {w.model_id for w in (box.context, box.batch, box.dtype, box.model)}

    def check(stack, depth):
        control = [box.context, box.batch, box.dtype, box.model][depth]
        assert controls[stack.model_id] is control and len(stack.children) == len(control.options)
        assert stack.selected_index == control.index
        for child in stack.children:
            if isinstance(child, widgets.Stack):
                check(child, depth + 1)
    check(box.stack, 0)
    # a view shows what its choice gives
    v = box.views[("SmolLM2-135M", 1024, 32, "int8")].value
    assert "1,024 tokens × batch 32" in v and f"{kv_cache_bytes(Config.smollm2_135m(), 1024, 32, 1):,} bytes" in v
    assert repr(box).startswith("memory_calculator_widget(5 models")


def test_calculator_state_stays_small(calculator):
    from ipywidgets.embed import dependency_state, embed_data

    state = dependency_state([calculator, *calculator.links])    # the widget, its views and its links
    assert len(state) > 5 * 8 * 3 * 3 + len(calculator.links)
    assert len(json.dumps(embed_data(views=[calculator], state=state)["manager_state"])) < 1_000_000


def test_calculator_bad_start():
    from kvlib.widgets import memory_calculator_widget

    with pytest.raises(ValueError, match="not one of"):
        memory_calculator_widget(start=("Llama-3-8B", 1000, 1, "float32"))
