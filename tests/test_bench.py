"""The benchmark command: its bandwidth probe and its report (the full run is `python -m kvlib.bench`)."""
from __future__ import annotations

from kvlib.bench import machine_description, memory_bandwidth, to_markdown


def _result(same=True):
    rows = [
        {"name": "kvlib, with cache", "seconds": [2.0], "median_seconds": 2.0, "tokens_per_s": 24.0, "decode_tokens_per_s": 30.0},
        {"name": "transformers, with cache", "seconds": [4.0], "median_seconds": 4.0, "tokens_per_s": 12.0, "decode_tokens_per_s": 15.0},
        {"name": "kvlib, without cache", "seconds": [20.0], "median_seconds": 20.0, "tokens_per_s": 2.4, "decode_tokens_per_s": None},
        {"name": "transformers, without cache", "seconds": [40.0], "median_seconds": 40.0, "tokens_per_s": 1.2, "decode_tokens_per_s": None},
    ]
    return {
        "machine": {"cpu": "Test CPU", "logical_cpus": 2, "torch_threads": 2, "python": "3.11", "torch": "2.13", "os": "x"},
        "prompt_tokens": 284, "new_tokens": 48, "repeats": {"cached": 3, "uncached": 1},
        "bandwidth_gb_s": 20.0, "weight_bytes": 538_000_000, "bandwidth_limit_tokens_per_s": 37.2,
        "rows": rows, "same_tokens": same,
        "ratios": {"kvlib_cached_vs_transformers_cached_decode": 2.0, "kvlib_cached_vs_transformers_cached_total": 2.0,
                   "kvlib_uncached_over_cached": 10.0, "transformers_uncached_over_cached": 10.0,
                   "kvlib_decode_share_of_bandwidth_limit": 0.81, "transformers_decode_share_of_bandwidth_limit": 0.4},
        "answer": "x", "date": "2026-11-29",
    }


def test_markdown_report_names_machine_and_ratios():
    md = to_markdown(_result())
    assert "Test CPU (2 logical CPUs, 2 torch threads)" in md
    assert "| kvlib, with cache | 2.00 s | 24.0 | 30.0 |" in md
    assert "| transformers, without cache | 40.00 s | 1.2 | – |" in md
    assert "| kvlib cached decode, share of the bandwidth limit | 81 % |" in md
    assert "Same tokens from all four: **True**" in md
    assert "Same tokens from all four: **False**" in to_markdown(_result(same=False))


def test_bandwidth_probe_is_plausible():
    gbs = memory_bandwidth(nbytes=64 * 2**20, repeats=3) / 1e9
    assert 0.1 < gbs < 10_000


def test_machine_description_has_threads():
    m = machine_description()
    assert m["torch_threads"] >= 1 and m["logical_cpus"] >= 1
