"""plot_levers: the closing page's picture of the levers (what a step reads, and the tokens per second)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from kvlib.measure.levers import LEVERS, Scenario, levers  # noqa: E402
from kvlib.measure.roofline import Accelerator  # noqa: E402
from kvlib.widgets.levers import CACHES_COLOUR, WEIGHTS_COLOUR, plot_levers  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402


def _bars(ax, colour):
    return [p for p in ax.patches if to_hex(p.get_facecolor()) == colour]


def test_each_lever_is_a_bar_of_what_its_step_reads_with_its_tokens_per_second():
    rows = levers(Scenario("Llama-3-8B", "NVIDIA H100 SXM", users=32, context=8192, shared_prefix=1024))
    ax = plot_levers(rows, title="the page's scenario")
    assert isinstance(ax, plt.Axes) and ax.get_title() == "the page's scenario"
    weights, caches = _bars(ax, WEIGHTS_COLOUR), _bars(ax, CACHES_COLOUR)
    assert len(weights) == len(caches) == len(LEVERS)
    for r, w, c in zip(rows, weights, caches):
        assert w.get_width() == pytest.approx(r.weight_bytes / 1e9)               # the weights, once a step
        assert w.get_width() + c.get_width() == pytest.approx(r.step_bytes / 1e9)
        assert c.get_x() == pytest.approx(w.get_width())                          # stacked
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == f"{rows[0].tokens_per_second:,.0f} tok/s, batch 14"
    assert all(f"{r.tokens_per_second:,.0f} tok/s" in t for r, t in zip(rows, texts))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("(a) bfloat16 weights") and labels[-1] == "(f) + speculative decoding"
    plt.close(ax.figure)


def test_a_compute_bound_step_and_a_scenario_where_no_user_fits_say_so():
    slow = Accelerator("a CPU", 3e11, 3e10, 4 * 10 ** 9, "made up")
    ax = plot_levers(levers(Scenario("SmolLM2-135M", slow, 8, 2048, 512)))
    assert ax.texts[-1].get_text().endswith("(compute-bound)")                   # (f): k + 1 tokens a row
    assert not ax.texts[0].get_text().endswith("(compute-bound)")
    plt.close(ax.figure)
    ax = plot_levers(levers(Scenario("Llama-3-70B", "NVIDIA GeForce RTX 4090", 8, 8192)))
    assert [t.get_text() for t in ax.texts] == ["no user fits"] * len(LEVERS)
    plt.close(ax.figure)
