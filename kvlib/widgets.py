"""Slider widgets for the cost of generation, with and without the KV cache.

Each widget is built in two separate halves:

- **computing**: pure functions that return one small dataclass per slider position
  (:func:`context_cost_data`, :func:`total_arithmetic_data`);
- **drawing**: functions that turn one position into a static HTML string (an inline SVG
  picture and a table: :func:`render_context_view`, :func:`render_total_view`).

The widget puts one pre-drawn view per position in an ``ipywidgets.Stack`` and links the
slider (and a play button) to it with ``jslink``: the link runs in the browser, so the
widget also works in the published HTML book, where no Python kernel is running. With a
running kernel, the context widget can in addition measure the chosen length live.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

from .config import Config
from .flops import StepFlops, fmt_flops, generation_step_flops, step_call, step_flops
from .measure import count_flops, fmt_ratio, fmt_seconds, median_seconds

__all__ = [
    "ContextPoint", "context_cost_data", "render_context_view", "context_cost_widget",
    "TotalPoint", "total_arithmetic_data", "render_total_view", "total_arithmetic_widget",
    "CostWidget",
]

# Colours (colour-blind safe, after ColorBrewer Dark2)
UNCACHED, UNCACHED_PALE = "#d95f02", "#fde3cc"
CACHED, CACHED_PALE = "#1b9e77", "#e4e4e4"
BUILT_HERE = "measured on the machine that built this page"


def _config_of(model_or_config) -> Config:
    if isinstance(model_or_config, Config):
        return model_or_config
    config = getattr(model_or_config, "config", None)
    if not isinstance(config, Config):
        raise TypeError(f"expected a kvlib.Decoder or a kvlib.Config, got {type(model_or_config).__name__}")
    return config


def _check_lengths(lengths: Sequence[int], upper: int | None = None) -> list[int]:
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths is empty: give at least one length")
    for n in lengths:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"every length must be a positive int, got {n!r}")
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
    (:mod:`kvlib.flops`), FLOPs PyTorch counted, and median measured seconds (``None``
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
    config = _config_of(model_or_config)
    model = None if isinstance(model_or_config, Config) else model_or_config
    lengths = _check_lengths(lengths, config.max_seq_len)
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


_TABLE = ('<table style="border-collapse:collapse;font-size:12px;margin-top:4px">{}</table>')
_TD = '<td style="padding:2px 10px;border-bottom:1px solid #ddd;text-align:{align}">{text}</td>'


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    def tr(cells, tag="td"):
        out = []
        for i, c in enumerate(cells):
            cell = _TD.format(align="left" if i == 0 else "right", text=c)
            out.append(cell.replace("<td", "<th").replace("</td>", "</th>") if tag == "th" else cell)
        return "<tr>" + "".join(out) + "</tr>"
    return _TABLE.format(tr(header, "th") + "".join(tr(r) for r in rows))


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
                     fmt_seconds(point.seconds_cached), fmt_ratio(point.seconds_ratio, "slower without")])
    table = _table(rows, ["", "without the cache", "with the cache", "ratio"])
    heading = (f'<div style="font-weight:bold;margin:2px 0 4px">One step at a context of {n:,} tokens</div>')
    return (f'<div style="font-family:sans-serif;font-size:12px;line-height:1.3">{heading}'
            f'{_grid_svg(n)}<br>{bars}{table}</div>')


class CostWidget:
    """Mixin: a short, stable ``repr`` for a widget (its default repr would spell out every
    child and its HTML, which would then be stored in the notebook as text)."""

    _summary = "widget"

    def __repr__(self) -> str:
        return self._summary


_VBOX_CLASS = None


def _vbox(children, summary):
    """An ``ipywidgets.VBox`` (same model and view in the browser) with a short repr."""
    global _VBOX_CLASS
    if _VBOX_CLASS is None:
        import ipywidgets as widgets

        _VBOX_CLASS = type("CostVBox", (CostWidget, widgets.VBox), {})
    box = _VBOX_CLASS(children)
    box._summary = summary
    return box


def _slider_stack(labels: Sequence[str], views: Sequence[str], description: str, start: int, interval: int):
    """A play button and a labelled slider, both ``jslink``-ed to a Stack of pre-drawn views."""
    import ipywidgets as widgets

    stack = widgets.Stack([widgets.HTML(v) for v in views], selected_index=start)
    slider = widgets.SelectionSlider(options=[(label, i) for i, label in enumerate(labels)], index=start,
                                     description=description, continuous_update=True,
                                     style={"description_width": "initial"},
                                     layout=widgets.Layout(width="420px"))
    play = widgets.Play(value=start, min=0, max=len(views) - 1, step=1, interval=interval,
                        description="play", layout=widgets.Layout(width="auto"))
    links = [widgets.jslink((slider, "index"), (stack, "selected_index")),
             widgets.jslink((play, "value"), (slider, "index"))]
    return play, slider, stack, links


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

    config = _config_of(model_or_config)
    model = None if isinstance(model_or_config, Config) else model_or_config
    if points is None:
        if lengths is None:
            raise ValueError("give lengths (context lengths to put on the slider) or points")
        points = context_cost_data(model_or_config, lengths, repeats=repeats, progress=progress)
    points = list(points)
    _check_lengths([p.context_len for p in points], config.max_seq_len)
    max_flops = max(p.uncached.total for p in points)
    views = [render_context_view(p, max_flops=max_flops, repeats=repeats) for p in points]
    labels = [f"{p.context_len:,} tokens" for p in points]
    if not 0 <= start < len(points):
        raise ValueError(f"start must index a position 0..{len(points) - 1}, got {start}")
    play, slider, stack, links = _slider_stack(labels, views, "context length", start, interval)
    rows = [widgets.HBox([play, slider])]
    if model is not None:
        live, out = _live_measurement(model, points, slider, repeats)
        rows.append(live)
        rows.append(stack)
        rows.append(out)
    else:
        rows.append(stack)
    box = _vbox(rows, f"context_cost_widget({len(points)} context lengths, "
                      f"{points[0].context_len}..{points[-1].context_len} tokens)")
    box._links, box.stack, box.slider, box.play = links, stack, slider, play
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
            f'({fmt_ratio(un / ca, "slower without")}).</div>'))

    toggle.observe(measure, names="value")
    slider.observe(measure, names="index")
    return widgets.HBox([toggle, note]), out


# =======================================================================================
# Widget 2: the total arithmetic of generating n tokens
# =======================================================================================

@dataclass(frozen=True)
class TotalPoint:
    """Total FLOPs of generating ``n_tokens`` tokens (after ``prompt_len`` prompt tokens) with
    the cache, without it (logits at the last position only, as :func:`kvlib.generate`
    computes them) and without it computing logits at every position (a plain forward pass),
    plus the running totals at a few steps along the way (for the picture)."""

    n_tokens: int
    prompt_len: int
    cached: int
    uncached: int
    uncached_all_logits: int
    curve_steps: tuple[int, ...]
    curve_cached: tuple[int, ...]
    curve_uncached: tuple[int, ...]

    @property
    def ratio(self) -> float:
        return self.uncached / self.cached

    @property
    def ratio_all_logits(self) -> float:
        return self.uncached_all_logits / self.cached


def total_arithmetic_data(config: Config, lengths: Sequence[int], *, prompt_len: int = 1,
                          samples: int = 48) -> list[TotalPoint]:
    """Totals for generating each of ``lengths`` tokens both ways, from :mod:`kvlib.flops`.

    With the default one-token prompt, generating ``n`` tokens runs steps at contexts
    ``1 .. n``. ``samples`` running totals per point are kept for drawing.
    """
    config = _config_of(config)
    lengths = _check_lengths(lengths)
    n_max = lengths[-1]

    def running(use_cache, last_only=True):
        total, out = 0, [0]
        for s in generation_step_flops(config, prompt_len, n_max, use_cache=use_cache, last_only=last_only):
            total += s.total
            out.append(total)
        return out            # out[k]: total of the first k steps

    cum_cached, cum_uncached, cum_all = running(True), running(False), running(False, last_only=False)
    points = []
    for n in lengths:
        ks = sorted({max(1, round(n * i / samples)) for i in range(samples + 1)} | {n})
        points.append(TotalPoint(
            n_tokens=n, prompt_len=prompt_len, cached=cum_cached[n], uncached=cum_uncached[n],
            uncached_all_logits=cum_all[n], curve_steps=tuple([0] + ks),
            curve_cached=tuple([0] + [cum_cached[k] for k in ks]),
            curve_uncached=tuple([0] + [cum_uncached[k] for k in ks])))
    return points


def _curves_svg(point: TotalPoint, width: int = 470, height: int = 210) -> str:
    """Running total of FLOPs against tokens generated: re-adding the list (uncached) versus
    the running total (cached)."""
    left, right, top, bottom = 64, 120, 12, 36
    w, h = width - left - right, height - top - bottom
    x_max, y_max = max(point.n_tokens, 1), max(point.uncached, 1)

    def xy(k, v):
        return left + w * k / x_max, top + h * (1 - v / y_max)

    def line(values, colour):
        pts = " ".join("{:.1f},{:.1f}".format(*xy(k, v)) for k, v in zip(point.curve_steps, values))
        return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2.5"/>'

    xe, ye_un = xy(point.n_tokens, point.uncached)
    _, ye_ca = xy(point.n_tokens, point.cached)
    ye_ca = min(max(ye_ca, ye_un + 14), top + h - 2)      # keep the two labels apart
    return "".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" role="img" '
        f'aria-label="running total of FLOPs over {point.n_tokens} generated tokens">',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="white" stroke="#888"/>',
        line(point.curve_uncached, UNCACHED), line(point.curve_cached, CACHED),
        f'<text x="{xe + 6:.1f}" y="{ye_un + 4:.1f}" font-size="11" fill="{UNCACHED}">without the cache</text>',
        f'<text x="{xe + 6:.1f}" y="{ye_ca + 4:.1f}" font-size="11" fill="{CACHED}">'
        f'with the cache</text>',
        f'<text x="{left - 6}" y="{top + 9}" font-size="10" text-anchor="end">{fmt_flops(point.uncached)}</text>',
        f'<text x="{left - 6}" y="{top + h}" font-size="10" text-anchor="end">0</text>',
        f'<text x="{left}" y="{top + h + 14}" font-size="10" text-anchor="middle">0</text>',
        f'<text x="{left + w}" y="{top + h + 14}" font-size="10" text-anchor="middle">{point.n_tokens:,}</text>',
        f'<text x="{left + w / 2}" y="{top + h + 30}" font-size="11" text-anchor="middle">tokens generated</text>',
        f'<text x="14" y="{top + h / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + h / 2})">FLOPs so far</text>',
        "</svg>"])


def render_total_view(point: TotalPoint, *, shapes: str = "") -> str:
    """The static view of one position of the total-arithmetic slider: running totals drawn
    both ways, and a table of the totals and their ratios."""
    n = point.n_tokens
    rows = [
        ["with the cache (the running total)", fmt_flops(point.cached), "1×"],
        ["without, logits at the last position only (as <code>kvlib.generate</code>)",
         fmt_flops(point.uncached), f"<b>{point.ratio:,.1f}×</b>"],
        ["without, logits at every position (a plain forward pass)", fmt_flops(point.uncached_all_logits),
         f"{point.ratio_all_logits:,.1f}×"],
    ]
    table = _table(rows, ["", "total FLOPs", "× the cached work"])
    prompt = "a one-token prompt" if point.prompt_len == 1 else f"a {point.prompt_len:,}-token prompt"
    on = f" for {html.escape(shapes)}" if shapes else ""
    heading = (f'<div style="font-weight:bold;margin:2px 0 4px">Generating {n:,} tokens after {prompt}'
               f'{on}</div>')
    return (f'<div style="font-family:sans-serif;font-size:12px;line-height:1.3">{heading}'
            f'{_curves_svg(point)}{table}</div>')


def total_arithmetic_widget(config: Config, lengths: Sequence[int] = tuple(2 ** k for k in range(12)), *,
                            prompt_len: int = 1, shapes: str = "", start: int | None = None,
                            interval: int = 1000):
    """A slider over the number of tokens generated showing the total arithmetic both ways
    and the ratio, from the closed form (nothing is measured, so the page shows exactly
    what a kernel would). Returns an ``ipywidgets.VBox``."""
    points = total_arithmetic_data(config, lengths, prompt_len=prompt_len)
    views = [render_total_view(p, shapes=shapes) for p in points]
    labels = [f"{p.n_tokens:,} tokens" for p in points]
    start = len(points) - 1 if start is None else start
    if not 0 <= start < len(points):
        raise ValueError(f"start must index a position 0..{len(points) - 1}, got {start}")
    play, slider, stack, links = _slider_stack(labels, views, "tokens generated", start, interval)
    import ipywidgets as widgets

    box = _vbox([widgets.HBox([play, slider]), stack],
                f"total_arithmetic_widget({len(points)} lengths, {points[0].n_tokens}..{points[-1].n_tokens} tokens)")
    box._links, box.stack, box.slider, box.play = links, stack, slider, play
    return box
