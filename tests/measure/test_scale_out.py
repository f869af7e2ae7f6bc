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
