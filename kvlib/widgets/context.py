"""A slider over the context length: the cost of one generation step, with and without the
KV cache (the section *Quadratic versus linear*).

Built in two halves: **computing** (:func:`context_cost_data`: one small dataclass per
slider position, from the closed form, PyTorch's FLOP counter and the clock) and
**drawing** (:func:`render_context_view`: one position as a static HTML string, an inline
SVG picture and a table). :func:`context_cost_widget` puts one pre-drawn view per position
in an ``ipywidgets.Stack`` linked to the slider in the browser (:mod:`kvlib.widgets.html`).
With a running kernel it can in addition measure the chosen length live.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

from ..checks import positive_int
from ..config import Config
from ..measure.flops import StepFlops, count_flops, fmt_flops, step_call, step_flops
from ..measure.timing import fmt_ratio, fmt_seconds, median_seconds
from .html import BUILT_HERE, CACHED, CACHED_PALE, UNCACHED, UNCACHED_PALE, html_table, slider_stack, widget_box

__all__ = ["ContextPoint", "context_cost_data", "render_context_view", "context_cost_widget",
           "config_of", "check_lengths"]


def config_of(model_or_config) -> Config:
    if isinstance(model_or_config, Config):
        return model_or_config
    config = getattr(model_or_config, "config", None)
    if not isinstance(config, Config):
        raise TypeError(f"expected a kvlib.Decoder or a kvlib.Config, got {type(model_or_config).__name__}")
    return config


def check_lengths(lengths: Sequence[int], upper: int | None = None) -> list[int]:
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths is empty: give at least one length")
    for n in lengths:
        positive_int("every length", n)
        if upper is not None and n > upper:
            raise ValueError(f"length {n} exceeds the model's max_seq_len={upper}")
    if sorted(set(lengths)) != lengths:
        raise ValueError(f"lengths must be strictly increasing, got {lengths}")
    return lengths


# =======================================================================================
# Widget 1: the cost of one step at a chosen context length
# =======================================================================================

@dataclass(frozen=True)
class ContextPoint:
    """One step at ``context_len`` tokens of context, both ways: FLOPs from the closed form
    (:mod:`kvlib.measure.flops`), FLOPs PyTorch counted, and median measured seconds (``None``
    where not counted or measured)."""

    context_len: int
    uncached: StepFlops
    cached: StepFlops
    counted_uncached: int | None = None
    counted_cached: int | None = None
    seconds_uncached: float | None = None
    seconds_cached: float | None = None

    @property
    def flops_ratio(self) -> float:
        """How many times more arithmetic the uncached step does."""
        return self.uncached.total / self.cached.total

    @property
    def seconds_ratio(self) -> float | None:
        """How many times longer the uncached step took (measured)."""
        if self.seconds_uncached is None or self.seconds_cached is None:
            return None
        return self.seconds_uncached / self.seconds_cached


def context_cost_data(model_or_config, lengths: Sequence[int], *, count: bool = True,
                      measure: bool = True, repeats: int = 3, progress: bool = False) -> list[ContextPoint]:
    """The cost of one generation step at each of ``lengths`` tokens of context, with and
    without the cache.

    With a :class:`kvlib.Decoder`, each step is also run under PyTorch's FLOP counter
    (``count``) and timed (``measure``: median of ``repeats`` runs after one warm-up);
    with a :class:`kvlib.Config` only the closed form is filled in.
    """
    config = config_of(model_or_config)
    model = None if isinstance(model_or_config, Config) else model_or_config
    lengths = check_lengths(lengths, config.max_seq_len)
    steps = lengths
    if progress:
        from tqdm.auto import tqdm
        steps = tqdm(lengths, desc="context lengths", unit="len")
    points = []
    for n in steps:
        found: dict[str, float | int | None] = {}
        for key, use_cache in (("uncached", False), ("cached", True)):
            counted = seconds = None
            if model is not None and (count or measure):
                fn = step_call(model, n, use_cache=use_cache)      # one prefill per (n, use_cache)
                counted = count_flops(fn) if count else None
                seconds = median_seconds(fn, repeats=repeats) if measure else None
            found[f"counted_{key}"], found[f"seconds_{key}"] = counted, seconds
        points.append(ContextPoint(context_len=n, uncached=step_flops(config, n, n),
                                   cached=step_flops(config, n, 1), **found))
    if progress:
        steps.close()
    return points


def _grid_svg(n: int, size: int = 150) -> str:
    """Two score grids for a step at context ``n``: the whole triangle without the cache,
    one new row with it. Queries run down, keys across."""
    pad, gap, top = 10, 70, 34
    xa, xb = pad, pad + size + gap
    y0, y1 = top, top + size
    height = top + size + 52
    if n <= 48:   # few enough tokens to draw the staircase of individual scores
        cell = size / n
        stairs = [(xa, y0)]
        for i in range(n):
            stairs += [(xa + (i + 1) * cell, y0 + i * cell), (xa + (i + 1) * cell, y0 + (i + 1) * cell)]
        lower_a = stairs + [(xa, y1)]
    else:
        lower_a = [(xa, y0), (xa + size, y1), (xa, y1)]
    row_h = max(2.0, size / n)
    lower_b = [(x - xa + xb, y) for x, y in lower_a]

    def poly(points, fill):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        return f'<polygon points="{pts}" fill="{fill}" stroke="none"/>'

    def text(x, y, s, anchor="start", size_px=12, weight="normal", fill="#222"):
        return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size_px}" text-anchor="{anchor}" '
                f'font-weight="{weight}" fill="{fill}">{html.escape(s)}</text>')

    width = xb + size + pad + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" role="img" '
             f'aria-label="attention scores computed in one step at a context of {n} tokens">']
    # without the cache: every row again
    parts.append(text(xa, 14, "without the cache", weight="bold", fill=UNCACHED))
    parts.append(text(xa, 28, f"all {n:,} rows again", size_px=11))
    parts.append(f'<rect x="{xa}" y="{y0}" width="{size}" height="{size}" fill="{UNCACHED_PALE}" stroke="#888"/>')
    parts.append(poly(lower_a, UNCACHED))
    parts.append(text(xa, y1 + 16, f"{n:,} × {n:,} = {n * n:,} scores", size_px=11))
    parts.append(text(xa, y1 + 30, "pale: masked, still computed", size_px=10, fill="#666"))
    # with the cache: one new row
    parts.append(text(xb, 14, "with the cache", weight="bold", fill=CACHED))
    parts.append(text(xb, 28, "one new row", size_px=11))
    parts.append(f'<rect x="{xb}" y="{y0}" width="{size}" height="{size}" fill="white" stroke="#888"/>')
    parts.append(poly(lower_b, CACHED_PALE))
    parts.append(f'<rect x="{xb}" y="{y1 - row_h:.1f}" width="{size}" height="{row_h:.1f}" fill="{CACHED}"/>')
    parts.append(text(xb, y1 + 16, f"1 × {n:,} = {n:,} scores", size_px=11))
    parts.append(text(xb, y1 + 30, "grey: done in earlier steps, not redone", size_px=10, fill="#666"))
    # axes
    parts.append(text(xa + size / 2, y1 + 44, "keys →", anchor="middle", size_px=10, fill="#666"))
    parts.append(text(xb + size / 2, y1 + 44, "keys →", anchor="middle", size_px=10, fill="#666"))
    parts.append(f'<text x="{xa + size + 14}" y="{y0 + size / 2}" font-size="10" fill="#666" text-anchor="middle" '
                 f'transform="rotate(90 {xa + size + 14} {y0 + size / 2})">queries →</text>')
    parts.append("</svg>")
    return "".join(parts)


def _bars_svg(rows: Sequence[tuple[str, float, str, str]], scale: float, caption: str, width: int = 470) -> str:
    """Horizontal bars ``(label, value, value text, colour)``, ``scale`` the full-width value."""
    label_w, bar_w, row = 110, width - 110 - 90, 20
    height = 18 + row * len(rows) + 4
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
             f'<text x="0" y="12" font-size="11" fill="#444">{html.escape(caption)}</text>']
    for i, (label, value, value_text, colour) in enumerate(rows):
        y = 18 + i * row
        length = max(1.0, bar_w * value / scale) if scale > 0 else 1.0
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">{html.escape(label)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{length:.1f}" height="13" fill="{colour}"/>')
        parts.append(f'<text x="{label_w + length + 5:.1f}" y="{y + 13}" font-size="11">{html.escape(value_text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_context_view(point: ContextPoint, *, max_flops: float | None = None, repeats: int | None = None,
                        where: str = BUILT_HERE) -> str:
    """The static view of one slider position: the two score grids, bars of the step's FLOPs
    (scaled to ``max_flops``, e.g. the largest uncached step on the slider) and a table of
    FLOPs and measured times."""
    n, un, ca = point.context_len, point.uncached, point.cached
    scale = max_flops or un.total
    bars = _bars_svg([("without the cache", un.total, fmt_flops(un.total), UNCACHED),
                      ("with the cache", ca.total, fmt_flops(ca.total), CACHED)], scale,
                     "FLOPs of this step (full bar: the costliest uncached step on this slider)")
    rows = [
        ["tokens fed through the model", f"{un.tokens_in:,}", f"{ca.tokens_in:,}", ""],
        ["projections + MLP", fmt_flops(un.linear), fmt_flops(ca.linear), f"{un.linear / ca.linear:,.0f}×"],
        ["attention (scores + weighted sum)", fmt_flops(un.attention), fmt_flops(ca.attention),
         f"{un.attention / ca.attention:,.0f}×"],
        ["output layer (last position)", fmt_flops(un.output), fmt_flops(ca.output), "1×"],
        ["<b>FLOPs of the step</b>", f"<b>{fmt_flops(un.total)}</b>", f"<b>{fmt_flops(ca.total)}</b>",
         f"<b>{point.flops_ratio:,.1f}× the work</b>"],
    ]
    if point.counted_uncached is not None and point.counted_cached is not None:
        same = point.counted_uncached == un.total and point.counted_cached == ca.total
        rows.append(["counted by PyTorch", fmt_flops(point.counted_uncached), fmt_flops(point.counted_cached),
                     "same as above" if same else "differs!"])
    if point.seconds_ratio is not None:
        runs = f", median of {repeats} runs" if repeats else ""
        rows.append([f"time of the step ({where}{runs})", fmt_seconds(point.seconds_uncached),
                     fmt_seconds(point.seconds_cached), fmt_ratio(point.seconds_ratio, "slower") + " without"])
    table = html_table(rows, ["", "without the cache", "with the cache", "ratio"])
    heading = (f'<div style="font-weight:bold;margin:2px 0 4px">One step at a context of {n:,} tokens</div>')
    return (f'<div style="font-family:sans-serif;font-size:12px;line-height:1.3">{heading}'
            f'{_grid_svg(n)}<br>{bars}{table}</div>')


def context_cost_widget(model_or_config, lengths: Sequence[int] | None = None, *,
                        points: Sequence[ContextPoint] | None = None, repeats: int = 3,
                        progress: bool = False, start: int = 0, interval: int = 1200):
    """A slider over context lengths showing, for one generation step at that length, the
    attention scores computed (the whole triangle again versus one new row), the FLOPs both
    ways and the measured time both ways, with the ratios.

    Give ``points`` from :func:`context_cost_data` to reuse measurements, or ``lengths`` to
    compute them here. Every position is drawn in advance, so the widget works in a static
    HTML page; the times it shows are labelled as measured on the machine that built the page.
    Given a model and a running kernel, "measure live" re-times the chosen length on this
    machine. Returns an ``ipywidgets.VBox``.
    """
    import ipywidgets as widgets

    config = config_of(model_or_config)
    model = None if isinstance(model_or_config, Config) else model_or_config
    if points is None:
        if lengths is None:
            raise ValueError("give lengths (context lengths to put on the slider) or points")
        points = context_cost_data(model_or_config, lengths, repeats=repeats, progress=progress)
    points = list(points)
    check_lengths([p.context_len for p in points], config.max_seq_len)
    max_flops = max(p.uncached.total for p in points)
    views = [render_context_view(p, max_flops=max_flops, repeats=repeats) for p in points]
    labels = [f"{p.context_len:,} tokens" for p in points]
    if not 0 <= start < len(points):
        raise ValueError(f"start must index a position 0..{len(points) - 1}, got {start}")
    play, slider, stack, links = slider_stack(labels, views, "context length", start, interval)
    rows = [widgets.HBox([play, slider])]
    if model is not None:
        live, out = _live_measurement(model, points, slider, repeats)
        rows.append(live)
        rows.append(stack)
        rows.append(out)
    else:
        rows.append(stack)
    box = widget_box(rows, f"context_cost_widget({len(points)} context lengths, "
                           f"{points[0].context_len}..{points[-1].context_len} tokens)", links)
    box.stack, box.slider, box.play = stack, slider, play
    return box


def _live_measurement(model, points: Sequence[ContextPoint], slider, repeats: int):
    """A toggle that, with a running kernel, re-times the slider's length on this machine."""
    import ipywidgets as widgets
    from IPython.display import HTML

    toggle = widgets.ToggleButton(value=False, description="measure live on this machine",
                                  tooltip="Re-time the chosen length here (needs a running Python kernel)",
                                  layout=widgets.Layout(width="260px"))
    note = widgets.HTML('<span style="font-size:11px;color:#666">needs a running kernel; in the '
                        'published page the table shows times measured on the machine that built it</span>')
    out = widgets.Output()

    def measure(*_):
        if not toggle.value:
            return
        n = points[slider.index].context_len
        un = median_seconds(step_call(model, n, use_cache=False), repeats=repeats)
        ca = median_seconds(step_call(model, n, use_cache=True), repeats=repeats)
        out.outputs = ()                 # (clear_output would need `with out:`, which breaks under nbval)
        out.append_display_data(HTML(
            f'<div style="font-family:sans-serif;font-size:12px">Measured live on this machine at '
            f'{n:,} tokens: without the cache {fmt_seconds(un)}, with the cache {fmt_seconds(ca)} '
            f'({fmt_ratio(un / ca, "slower")} without).</div>'))

    toggle.observe(measure, names="value")
    slider.observe(measure, names="index")
    return widgets.HBox([toggle, note]), out


