"""kvlib.widgets: the numbers behind each slider position, and a widget that works without a kernel."""
from __future__ import annotations

import re
import json

import ipywidgets as widgets
from ipywidgets.widgets.widget_link import Link
import pytest
import torch

import kvlib
from kvlib.measure.flops import generation_flops, step_flops
from kvlib.widgets.html import BUILT_HERE
from kvlib.widgets import (context_cost_data, context_cost_widget, render_context_view,
                           render_total_view, total_arithmetic_data, total_arithmetic_widget)

LENGTHS = [4, 8, 16, 40]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return kvlib.Decoder(kvlib.Config.tiny()).eval()


@pytest.fixture(scope="module")
def points(model):
    return context_cost_data(model, LENGTHS, repeats=1)


def _links(box):
    return [w for w in box.links if isinstance(w, Link)]


def _state_bytes(box) -> int:
    """Bytes of the state the page embeds for ``box`` and the widgets it depends on (not every
    widget alive in this process, which other tests' widgets would inflate)."""
    from ipywidgets.embed import dependency_state, embed_data

    return len(json.dumps(embed_data(views=[box], state=dependency_state([box]))["manager_state"]))


# ------------------------------------------------------------------ computing

def test_context_data_equals_kvlib_flops_and_the_counter(model, points):
    cfg = model.config
    assert [p.context_len for p in points] == LENGTHS
    for p in points:
        n = p.context_len
        assert p.uncached == step_flops(cfg, n, n)
        assert p.cached == step_flops(cfg, n, 1)
        assert p.counted_uncached == p.uncached.total
        assert p.counted_cached == p.cached.total
        assert p.seconds_uncached > 0 and p.seconds_cached > 0
        assert p.flops_ratio == p.uncached.total / p.cached.total
        assert p.seconds_ratio == p.seconds_uncached / p.seconds_cached


def test_context_data_from_a_config_is_closed_form_only():
    cfg = kvlib.Config.smollm2_135m()
    pts = context_cost_data(cfg, [128, 2048])
    assert pts[1].uncached == step_flops(cfg, 2048, 2048)
    assert pts[1].counted_uncached is None and pts[1].seconds_ratio is None


def test_total_data_equals_kvlib_flops():
    cfg = kvlib.Config.small()
    pts = total_arithmetic_data(cfg, [1, 16, 300])
    for p in pts:
        assert p.cached == generation_flops(cfg, 1, p.n_tokens, use_cache=True)
        assert p.uncached == generation_flops(cfg, 1, p.n_tokens, use_cache=False)
        assert p.uncached_all_logits == generation_flops(cfg, 1, p.n_tokens, use_cache=False, last_only=False)
        assert p.curve_steps[0] == 0 and p.curve_steps[-1] == p.n_tokens
        assert p.curve_uncached[-1] == p.uncached and p.curve_cached[-1] == p.cached
        assert list(p.curve_uncached) == sorted(p.curve_uncached)
    assert pts[0].ratio == 1.0                      # one token: both ways feed the same single token
    assert pts[2].ratio > pts[1].ratio > 1


@pytest.mark.parametrize("bad", [[], [8, 4], [0, 4], [4, 4000]])
def test_bad_lengths_are_refused(model, bad):
    with pytest.raises(ValueError):
        context_cost_data(model, bad, measure=False, count=False)


# ------------------------------------------------------------------ drawing

def test_views_show_the_numbers_and_differ(points):
    views = [render_context_view(p, repeats=1) for p in points]
    assert len(set(views)) == len(views)
    for p, v in zip(points, views):
        assert v.count("<svg") == 2 and "<table" in v
        assert f"{p.context_len:,} × {p.context_len:,}" in v
        assert BUILT_HERE in v                    # measured times say where they were measured
        assert re.search(r"\d× (slower|faster) without", v)


def test_total_view_names_the_shapes():
    p = total_arithmetic_data(kvlib.Config.tiny(), [64])[0]
    v = render_total_view(p, shapes="tiny shapes")
    assert "tiny shapes" in v and "<svg" in v and f"{p.ratio:,.1f}×" in v


# ------------------------------------------------------------------ the widgets

def test_context_widget_is_a_static_stack_with_jslinks(model, points):
    box = context_cost_widget(model, points=points, repeats=1)
    assert isinstance(box, widgets.VBox)
    stack, slider, play = box.stack, box.slider, box.play
    assert isinstance(stack, widgets.Stack) and len(stack.children) == len(points)
    assert all(isinstance(c, widgets.HTML) for c in stack.children)
    assert len({c.value for c in stack.children}) == len(points)
    assert [label for label, _ in slider.options] == [f"{n:,} tokens" for n in LENGTHS]
    links = _links(box)
    pairs = {(link.source[0].model_id, link.source[1], link.target[0].model_id, link.target[1]) for link in links}
    assert (slider.model_id, "index", stack.model_id, "selected_index") in pairs
    assert (play.model_id, "value", slider.model_id, "index") in pairs
    assert play.max == len(points) - 1
    # a short repr, so the notebook does not store every view as text
    assert repr(box).startswith("context_cost_widget(4 context lengths")
    assert len(box._repr_mimebundle_()["text/plain"]) < 110


def test_context_widget_measures_live_with_a_kernel(model, points):
    box = context_cost_widget(model, points=points, repeats=1)
    toggle = box.children[1].children[0]
    out = box.children[-1]
    assert isinstance(toggle, widgets.ToggleButton) and isinstance(out, widgets.Output)
    assert out.outputs == ()
    toggle.value = True                            # measures the current position
    assert len(out.outputs) == 1
    assert "Measured live on this machine at 4 tokens" in out.outputs[0]["data"]["text/html"]
    box.slider.index = 2                           # follows the slider while on
    assert len(out.outputs) == 1                   # replaced, not appended
    assert "at 16 tokens" in out.outputs[0]["data"]["text/html"]
    toggle.value = False
    box.slider.index = 3                           # off: nothing re-measured
    assert "at 16 tokens" in out.outputs[0]["data"]["text/html"]


def test_context_widget_from_a_config_has_no_live_part():
    box = context_cost_widget(kvlib.Config.tiny(), [4, 8])
    assert not any(isinstance(w, widgets.Output) for w in box.children)
    assert BUILT_HERE not in box.stack.children[0].value


def test_total_widget(model):
    box = total_arithmetic_widget(kvlib.Config.smollm2_135m(), shapes="SmolLM2-135M shapes")
    assert isinstance(box, widgets.VBox)
    assert len(box.stack.children) == 12 and box.slider.index == 11 and box.stack.selected_index == 11
    assert len({c.value for c in box.stack.children}) == 12
    assert "2,048 tokens" in box.stack.children[-1].value
    assert len(_links(box)) == 2


def test_embedded_state_stays_small(model):
    lengths = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
    cfg = kvlib.Config.small()
    pts = context_cost_data(cfg, lengths)
    # fake measurements: the size of the page does not depend on the values
    pts = [type(p)(**{**p.__dict__, "seconds_uncached": 0.5, "seconds_cached": 0.01}) for p in pts]
    box = context_cost_widget(cfg, points=pts)
    assert _state_bytes(box) < 300_000
    assert _state_bytes(total_arithmetic_widget(cfg)) < 300_000


def test_the_parallel_timeline_draws_one_row_per_device():
    import matplotlib
    matplotlib.use("Agg")
    from kvlib.cache import MODEL_SHAPES
    from kvlib.measure.roofline import REFERENCE_ACCELERATORS
    from kvlib.measure.scale_out import REFERENCE_LINKS, pipeline_parallel_timeline
    from kvlib.widgets.scale_out import plot_timeline

    segments = pipeline_parallel_timeline(MODEL_SHAPES["Llama-3-70B"], 32, 4, 4,
                                          REFERENCE_ACCELERATORS["NVIDIA H100 SXM"],
                                          REFERENCE_LINKS["InfiniBand NDR 400 Gb/s"])
    ax = plot_timeline(segments, title="pipeline")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    assert len(ax.patches) == len(segments) and ax.get_xlabel().endswith("(ms)")
    assert sorted(t.get_text() for t in ax.texts)[:2] == ["batch 0", "batch 0"]
