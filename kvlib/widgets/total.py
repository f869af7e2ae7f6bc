"""A slider over the number of tokens generated: the total arithmetic with and without the
KV cache, from the closed form (the section *Quadratic versus linear*). Nothing is
measured, so the published page shows exactly what a kernel would."""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

from ..config import Config
from ..measure.flops import fmt_flops, generation_step_flops
from .context import check_lengths, config_of
from .html import CACHED, UNCACHED, html_table, slider_stack, widget_box

__all__ = ["TotalPoint", "total_arithmetic_data", "render_total_view", "total_arithmetic_widget"]


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
    """Totals for generating each of ``lengths`` tokens both ways, from :mod:`kvlib.measure.flops`.

    With the default one-token prompt, generating ``n`` tokens runs steps at contexts
    ``1 .. n``. ``samples`` running totals per point are kept for drawing.
    """
    config = config_of(config)
    lengths = check_lengths(lengths)
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
    one new row per step (cached)."""
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
        ["with the cache (one new row per step)", fmt_flops(point.cached), "1×"],
        ["without, logits at the last position only (as <code>kvlib.generate</code>)",
         fmt_flops(point.uncached), f"<b>{point.ratio:,.1f}×</b>"],
        ["without, logits at every position (a plain forward pass)", fmt_flops(point.uncached_all_logits),
         f"{point.ratio_all_logits:,.1f}×"],
    ]
    table = html_table(rows, ["", "total FLOPs", "× the cached work"])
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
    play, slider, stack, links = slider_stack(labels, views, "tokens generated", start, interval)
    import ipywidgets as widgets

    box = widget_box([widgets.HBox([play, slider]), stack],
                     f"total_arithmetic_widget({len(points)} lengths, {points[0].n_tokens}..{points[-1].n_tokens} tokens)",
                     links)
    box.stack, box.slider, box.play = stack, slider, play
    return box
