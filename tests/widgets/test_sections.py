"""The batching and quantization sections' widgets and the KIVI cache: every view drawn, every
control linked in the browser, the numbers drawn are the ones measured."""
from __future__ import annotations

import pytest
import torch
from ipywidgets.widgets.widget_link import Link

from kvlib import Config, Decoder
from kvlib.cache import KiviKVCache
from kvlib.measure.experiments import BatchPoint
from kvlib.measure.roofline import roofline_seconds
from kvlib.serve import Request, serve
from kvlib.widgets.batching import batch_size_widget, lanes, render_batch_view, timeline_svg, timeline_widget
from kvlib.widgets.quant import grid_point, quant_grid_widget


def test_roofline_is_the_slower_of_arithmetic_and_memory():
    assert roofline_seconds(100, 10, flops_per_s=10, bytes_per_s=10) == 10
    assert roofline_seconds(10, 100, flops_per_s=10, bytes_per_s=10) == 10
    p = BatchPoint(8, step_seconds=0.1, roofline_seconds=0.05)
    assert p.tokens_per_s == 80 and p.roofline_tokens_per_s == 160


def test_batch_size_widget_draws_every_batch_and_links_the_slider():
    points = [BatchPoint(b, 0.05 + 0.002 * b, max(0.02, 0.001 * b)) for b in (1, 2, 4, 8)]
    box = batch_size_widget(points)
    assert len(box.stack.children) == 4 and repr(box) == "batch_size_widget(4 batch sizes, 1..8)"
    assert any(isinstance(l, Link) and l.source[0] is box.slider and l.target[0] is box.stack for l in box.links)
    view = render_batch_view(points, 2)                       # batch 4: 4 / 0.058 s = 69.0 tokens/s
    assert "Batch of 4 sequences" in view and "69.0" in view
    with pytest.raises(ValueError, match="no points"):
        batch_size_widget([])


def test_timeline_draws_every_lane_of_every_step_and_toggles_between_runs():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    reqs = [Request([1, 2, 3], 2), Request([4, 5], 5), Request([6], 1)]
    runs = {policy: serve(model, reqs, max_batch=2, policy=policy) for policy in ("static", "continuous")}
    svg = timeline_svg(runs["static"])
    assert svg.count("<rect") == 2 * runs["static"].steps + 5                  # two lanes a step, and the legend's 5
    drawn = lanes(runs["continuous"])
    assert [[w for w, _ in row] for row in drawn][:3] == [["prefill", "prefill"], ["decode", "decode"],
                                                         ["prefill", "decode"]]
    assert {i for row in drawn for _, i in row} == {0, 1, 2, None}
    box = timeline_widget(runs)
    assert len(box.stack.children) == 2 and len(box.links) == 1


def test_quant_grid_more_bits_smaller_error_and_every_view_linked():
    w = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    errors = [grid_point(w, bits, 32).rms_error for bits in (2, 3, 4, 8)]
    assert errors == sorted(errors, reverse=True)
    assert grid_point(w, 4, 32).rms_error < grid_point(w, 4, None).rms_error       # smaller groups fit better
    assert len(grid_point(w, 3, 32).levels) == 8 and grid_point(w, 4, 32).bits_per_weight == 5.0
    box = quant_grid_widget(w, "w", bits=(2, 4), groups=(32, None))
    assert len(box.stack.children) == 2 and len(box.links) == 3 and len(box.points) == 4


def test_kivi_cache_rounds_whole_groups_and_keeps_the_recent_tokens_exact():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).double().eval()
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    exact = model(ids)
    everything_recent = KiviKVCache.for_model(model, max_len=20, bits=4, recent=20)
    torch.testing.assert_close(model(ids, everything_recent), exact)            # nothing rounded yet
    no_whole_group = KiviKVCache.for_model(model, max_len=20, bits=2, group=32)
    torch.testing.assert_close(model(ids, no_whole_group), exact)               # 20 tokens: no group of 32
    rounded = model(ids, KiviKVCache.for_model(model, max_len=20, bits=2, group=4))
    assert not torch.allclose(rounded, exact)
    cache = KiviKVCache.for_model(model, max_len=20, bits=4, group=4, recent=4)
    assert cache.format_bytes(20) < KiviKVCache.for_model(model, max_len=20, bits=8, group=4).format_bytes(20)
    assert cache.format_bytes(20) < KiviKVCache.for_model(model, max_len=20, bits=4, group=32).format_bytes(20)
    with pytest.raises(ValueError, match="bits must be a positive int"):
        KiviKVCache.for_model(model, max_len=20, bits=0)
