"""The bytes each way of serving past one machine moves (kvlib.measure.scale_out), against the
formulas worked by hand for Llama-3-70B and the tiny model."""
from __future__ import annotations

import pytest

from kvlib import Config
from kvlib.cache import MODEL_SHAPES
from kvlib.measure.flops import step_flops
from kvlib.measure.scale_out import (REFERENCE_LINKS, disaggregation_bytes, pipeline_parallel_bytes, prefill_flops,
                                     tensor_parallel_bytes)

BIG = MODEL_SHAPES["Llama-3-70B"]           # d_model 8192, 80 layers, 8 KV heads of 128


def test_tensor_parallel_is_two_ring_all_reduces_per_layer():
    # 80 layers × 2 all-reduces × (32 tokens × 8192 × 2 bytes) × 2 × 7/8
    assert tensor_parallel_bytes(BIG, 32, 8) == pytest.approx(80 * 2 * 32 * 8192 * 2 * 2 * 7 / 8)
    assert tensor_parallel_bytes(BIG, 32, 1) == 0                 # one device sums nothing
    assert tensor_parallel_bytes(BIG.config, 32, 8) == tensor_parallel_bytes(BIG, 32, 8)


def test_pipeline_parallel_moves_activations_once_per_boundary():
    assert pipeline_parallel_bytes(BIG, 32, 4) == 3 * 32 * 8192 * 2
    assert pipeline_parallel_bytes(BIG, 32, 1) == 0


def test_disaggregation_moves_the_prompts_whole_cache_once():
    # 80 layers × 2 (K and V) × 8 heads × 128 × 2 bytes = 327,680 bytes a token
    assert disaggregation_bytes(BIG, 4000) == 4000 * 327_680
    tiny = Config.tiny()
    assert disaggregation_bytes(tiny, 10, dtype_bytes=4) == 10 * 2 * tiny.n_layers * tiny.n_kv_heads * tiny.head_dim * 4


def test_prefill_flops_is_the_step_that_computes_every_prompt_token():
    assert prefill_flops(BIG, 100) == step_flops(BIG.config, 100, 100).total


def test_every_link_names_its_source():
    assert REFERENCE_LINKS and all(k.bytes_per_s > 0 and k.source for k in REFERENCE_LINKS.values())


def test_the_tensor_parallel_timeline_reads_a_share_then_waits_for_the_all_reduce():
    from kvlib.measure.roofline import REFERENCE_ACCELERATORS
    from kvlib.measure.scale_out import tensor_parallel_timeline

    gpu, link = REFERENCE_ACCELERATORS["NVIDIA H100 SXM"], REFERENCE_LINKS["NVLink (H100 SXM)"]
    segments = tensor_parallel_timeline(BIG, 32, 8, gpu, link, layers=2)
    assert len(segments) == 2 * 4 * 8 and {s.device for s in segments} == set(range(8))
    c = BIG.config
    first = [s for s in segments if s.device == 0][:4]
    assert [s.kind for s in first] == ["attention", "all-reduce", "MLP", "all-reduce"]
    attention_bytes = c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads) * 2
    assert first[0].seconds == pytest.approx(attention_bytes / 8 / gpu.bytes_per_s)
    assert first[2].seconds == pytest.approx(3 * c.d_model * c.d_mlp * 2 / 8 / gpu.bytes_per_s)
    assert first[1].seconds == pytest.approx(tensor_parallel_bytes(BIG, 32, 8) / 160 / link.bytes_per_s)
    assert all(a.start + a.seconds == pytest.approx(b.start) for a, b in zip(first, first[1:]))


def test_the_pipeline_fills_with_batches_in_flight():
    """Stage s starts batch b once stage s - 1 has finished and sent it: the last batch leaves the
    last stage after (stages + batches - 1) stage times and (stages - 1) sends."""
    from kvlib.measure.roofline import REFERENCE_ACCELERATORS
    from kvlib.measure.scale_out import pipeline_parallel_timeline

    gpu, link = REFERENCE_ACCELERATORS["NVIDIA H100 SXM"], REFERENCE_LINKS["InfiniBand NDR 400 Gb/s"]
    segments = pipeline_parallel_timeline(BIG, 32, 4, 3, gpu, link)
    stages = [s for s in segments if s.kind == "stage"]
    sends = [s for s in segments if s.kind == "send"]
    assert len(stages) == 12 and len(sends) == 9
    stage, send = stages[0].seconds, sends[0].seconds
    assert send == pytest.approx(pipeline_parallel_bytes(BIG, 32, 2) / link.bytes_per_s)
    assert max(s.start + s.seconds for s in stages) == pytest.approx(6 * stage + 3 * send)
    assert min(s.start for s in stages if s.device == 3) == pytest.approx(3 * (stage + send))
