"""The benchmark command: its bandwidth probe and its report (the full run is `python -m kvlib.bench`)."""
from __future__ import annotations

from kvlib.measure.bench import to_markdown
from kvlib.measure.hardware import machine_description, memory_bandwidth


def _result(same=True):
    rows = [
        {"name": "kvlib, with cache", "seconds": [2.0], "median_seconds": 2.0, "tokens_per_s": 24.0, "decode_tokens_per_s": 30.0},
        {"name": "transformers, with cache", "seconds": [4.0], "median_seconds": 4.0, "tokens_per_s": 12.0, "decode_tokens_per_s": 15.0},
        {"name": "kvlib, without cache", "seconds": [20.0], "median_seconds": 20.0, "tokens_per_s": 2.4, "decode_tokens_per_s": None},
        {"name": "transformers, without cache", "seconds": [40.0], "median_seconds": 40.0, "tokens_per_s": 1.2, "decode_tokens_per_s": None},
    ]
    return {
        "machine": {"cpu": "Test CPU", "vector_extensions": "AVX2", "logical_cpus": 2, "torch_threads": 2, "python": "3.11", "torch": "2.13", "os": "x"},
        "prompt_tokens": 284, "new_tokens": 48, "repeats": {"cached": 3, "uncached": 1},
        "bandwidth_gb_s": 20.0, "weight_bytes": 538_000_000, "bandwidth_limit_tokens_per_s": 37.2,
        "weight_read_floor_ms": 25.0, "compile_seconds": None,
        "rows": rows, "same_tokens": same,
        "ratios": {"kvlib_cached_vs_transformers_cached_decode": 2.0, "kvlib_cached_vs_transformers_cached_total": 2.0,
                   "kvlib_uncached_over_cached": 10.0, "transformers_uncached_over_cached": 10.0,
                   "kvlib_decode_share_of_bandwidth_limit": 0.81, "transformers_decode_share_of_bandwidth_limit": 0.4,
                   "weight_read_floor_share_of_bandwidth_limit": 1.075, "weight_read_floor_vs_transformers_cached_decode": 2.67},
        "answer": "x", "date": "2026-11-29",
    }


def test_markdown_report_names_machine_and_ratios():
    md = to_markdown(_result())
    assert "Test CPU (AVX2 vector instructions, 2 logical CPUs, 2 torch threads)" in md
    assert "| kvlib, with cache | 2.00 s | 24.0 | 30.0 |" in md
    assert "| transformers, without cache | 40.00 s | 1.2 | – |" in md
    assert "| kvlib cached decode, share of the bandwidth limit | 81 % |" in md
    assert "Same tokens from all 4: **True**" in md
    assert "Same tokens from all 4: **False**" in to_markdown(_result(same=False))
    assert "takes 25.0 ms" in md and "at best 40.0 tokens/s, 2.67× transformers' cached decode" in md
    assert "compiled" not in md
    # 25 ms of floor at 30 decode tokens/s: the step is 75 % floor
    assert "| kvlib, with cache: decode step, share of the weight-read floor | 75 % |" in md


def test_markdown_report_names_the_wall_from_the_measurement():
    """The sentence about what limits a step follows the measured floor, on either kind of machine."""
    result = _result()
    result["ratios"]["weight_read_floor_share_of_bandwidth_limit"] = 0.92
    assert "on this machine memory is the wall" in to_markdown(result)
    result["ratios"]["weight_read_floor_share_of_bandwidth_limit"] = 0.40
    md = to_markdown(result)
    assert "matrix-vector kernel, not memory, is the wall" in md and "memory is the wall" not in md


def test_markdown_report_with_the_compiled_row():
    result = _result()
    result["rows"].insert(1, {"name": "kvlib, with cache, compiled", "seconds": [1.5], "median_seconds": 1.5,
                              "tokens_per_s": 32.0, "decode_tokens_per_s": 36.0})
    result["compile_seconds"] = 61.0
    result["ratios"].update({"kvlib_compiled_vs_transformers_cached_decode": 2.4,
                             "kvlib_compiled_decode_share_of_bandwidth_limit": 0.97,
                             "kvlib_uncached_over_compiled_cached": 13.3})
    md = to_markdown(result)
    assert "| kvlib, with cache, compiled | 1.50 s | 32.0 | 36.0 |" in md
    assert "| kvlib compiled cached decode / transformers cached decode (tokens/s) | 2.40× |" in md
    assert "| kvlib compiled cached decode, share of the bandwidth limit | 97 % |" in md
    assert "| kvlib: time without cache / with cache, compiled | 13.3× |" in md
    assert "took 61.00 s" in md
    assert "Same tokens from all 5" in md


def test_bandwidth_probe_is_plausible():
    gbs = memory_bandwidth(nbytes=64 * 2**20, repeats=3) / 1e9
    assert 0.1 < gbs < 10_000


def test_machine_description_has_threads():
    m = machine_description()
    assert m["torch_threads"] >= 1 and m["logical_cpus"] >= 1
