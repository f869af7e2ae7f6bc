"""The batching section's widgets and pictures: throughput against the batch size (a slider),
and the timeline of the serving engine's steps (a picture, and a toggle between policies).

Both widgets draw every view in advance and link their controls to them in the browser
(:mod:`kvlib.widgets.html`), so they work in the published book with no kernel running.
"""
from __future__ import annotations

import html
from typing import Mapping, Sequence

from ..measure.experiments import BatchPoint
from ..measure.timing import fmt_seconds
from ..serve.report import ServeReport
from .html import BUILT_HERE, CACHED, UNCACHED, html_table, link_index, slider_stack, widget_box
from .html import stack as html_stack

__all__ = ["WORK_COLOURS", "render_batch_view", "batch_size_widget", "lanes", "timeline_svg", "timeline_widget",
           "plot_timeline"]

# What a request did in a step (colour-blind safe, after ColorBrewer Dark2 and greys)
WORK_COLOURS = {"prefill": "#7570b3", "decode": CACHED, "waiting": "#e6ab02", "preempted": UNCACHED, "idle": "#dddddd"}


def _curve_svg(points: Sequence[BatchPoint], chosen: int, width: int = 460, height: int = 200) -> str:
    """Measured and predicted tokens/s against the batch size (log scale), a dot at ``chosen``."""
    import math

    left, bottom, top = 48, 26, 12
    xs = [math.log2(p.batch) for p in points]
    peak = max(max(p.tokens_per_s for p in points), max(p.roofline_tokens_per_s for p in points))

    def xy(x, y):
        span = (xs[-1] - xs[0]) or 1.0
        return (left + (x - xs[0]) / span * (width - left - 12), height - bottom - y / peak * (height - bottom - top))

    def line(values, colour, dash=""):
        pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in (xy(x, v) for x, v in zip(xs, values)))
        return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2" {dash}/>'

    parts = [f'<svg width="{width}" height="{height}" style="font-family:sans-serif;font-size:11px">',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - 8}" y2="{height - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
             line([p.roofline_tokens_per_s for p in points], "#888", 'stroke-dasharray="5,4"'),
             line([p.tokens_per_s for p in points], CACHED)]
    for p, x in zip(points, xs):
        a, b = xy(x, 0)
        parts.append(f'<text x="{a:.1f}" y="{height - 8}" text-anchor="middle">{p.batch}</text>')
    c = points[chosen]
    a, b = xy(xs[chosen], c.tokens_per_s)
    parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="5" fill="{CACHED}"/>')
    parts.append(f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{peak:.0f}</text>')
    parts.append(f'<text x="{left + 6}" y="{top + 8}" fill="#444">tokens/s (solid: measured; dashed: roofline)</text>')
    parts.append(f'<text x="{width - 10}" y="{height - bottom - 6}" text-anchor="end" fill="#444">batch size</text>')
    return "".join(parts) + "</svg>"


def render_batch_view(points: Sequence[BatchPoint], chosen: int, where: str = BUILT_HERE) -> str:
    """One slider position: the throughput curve with the chosen batch marked, and its numbers."""
    p, one = points[chosen], points[0]
    rows = [["one decode step (all rows)", fmt_seconds(p.step_seconds), fmt_seconds(p.roofline_seconds)],
            ["tokens/s over all rows", f"{p.tokens_per_s:,.1f}", f"{p.roofline_tokens_per_s:,.1f}"],
            [f"× the tokens/s of batch {one.batch}", f"{p.tokens_per_s / one.tokens_per_s:,.2f}×",
             f"{p.roofline_tokens_per_s / one.roofline_tokens_per_s:,.2f}×"],
            ["time between two tokens of one row", fmt_seconds(p.step_seconds), fmt_seconds(p.roofline_seconds)]]
    return (f'<div style="font-family:sans-serif;font-size:12px;line-height:1.3">'
            f'<div style="font-weight:bold;margin:2px 0 4px">Batch of {p.batch} sequences ({html.escape(where)})</div>'
            f'{_curve_svg(points, chosen)}{html_table(rows, ["", "measured", "roofline"])}</div>')


def batch_size_widget(points: Sequence[BatchPoint], *, start: int = 0, interval: int = 1200):
    """A slider over the measured batch sizes: throughput and per-token latency, measured and
    predicted by the roofline. Every position is drawn in advance. Returns an ``ipywidgets.VBox``."""
    import ipywidgets as widgets

    points = list(points)
    if not points:
        raise ValueError("no points: measure at least one batch size (kvlib.measure.experiments.steps_at_context)")
    views = [render_batch_view(points, i) for i in range(len(points))]
    play, slider, stack, links = slider_stack([f"batch {p.batch}" for p in points], views, "batch size", start, interval)
    box = widget_box([widgets.HBox([play, slider]), stack], f"batch_size_widget({len(points)} batch sizes, "
                     f"{points[0].batch}..{points[-1].batch})", links)
    box.stack, box.slider, box.play = stack, slider, play
    return box


def lanes(report: ServeReport) -> list[list[tuple[str, int | None]]]:
    """What each place of the batch did at each step, for drawing: ``[step][lane] = (work, request)``.

    The engine has no slots: it runs whichever requests are running. For a picture, each request
    gets the lowest free *lane* when it starts running and keeps it until it finishes or is
    preempted. ``work`` is ``"prefill"`` or ``"decode"`` (it ran in this step's forward pass),
    ``"waiting"`` (running, but this step's prefill budget was spent), ``"preempted"`` (its blocks
    were taken back in this step) or ``"idle"`` (no request).
    """
    held: list[int | None] = [None] * report.max_batch
    out = []
    for step in report.timeline:
        did = {i: kind for i, kind, _ in step.work} | {i: "preempted" for i in step.preempted}
        present = list(dict.fromkeys([*step.running, *did]))     # running, or preempted in this step
        held = [i if i in present else None for i in held]       # lanes of finished requests are free again
        for i in present:                                        # newcomers take the lowest free lanes
            if i not in held:
                held[held.index(None)] = i
        out.append([("idle", None) if i is None else (did.get(i, "waiting"), i) for i in held])
    return out


def timeline_svg(report: ServeReport, width: int = 640, row_px: int = 18, until: float | None = None) -> str:
    """The running requests of ``report`` over time: one row per lane of the batch (:func:`lanes`),
    one box per step as wide as the step took, coloured by what its request did, with the request
    written in where it starts; below, the blocks of the pool in use after each step."""
    end = until or max(s.start + s.seconds for s in report.timeline)
    left, top = 52, 16
    scale = (width - left - 8) / end
    height = top + row_px * report.max_batch + 30
    parts = [f'<svg width="{width}" height="{height}" style="font-family:sans-serif;font-size:10px">']
    for lane in range(report.max_batch):
        y = top + lane * row_px
        parts.append(f'<text x="{left - 6}" y="{y + row_px - 5}" text-anchor="end">lane {lane}</text>')
    previous: list[int | None] = [None] * report.max_batch
    for step, row in zip(report.timeline, lanes(report)):
        x, w = left + step.start * scale, max(step.seconds * scale, 0.6)
        for lane, (work, request) in enumerate(row):
            y = top + lane * row_px
            parts.append(f'<rect x="{x:.2f}" y="{y + 1}" width="{w:.2f}" height="{row_px - 2}" '
                         f'fill="{WORK_COLOURS[work]}"/>')
            if request is not None and request != previous[lane]:
                parts.append(f'<text x="{x + 2:.1f}" y="{y + row_px - 5}" fill="#fff">{request}</text>')
        previous = [request for _, request in row]
    legend_y = top + row_px * report.max_batch + 16
    x = left
    for work, colour in WORK_COLOURS.items():
        parts.append(f'<rect x="{x}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 13}" y="{legend_y}">{work}</text>')
        x += 75
    peak = max(s.blocks_used for s in report.timeline)
    parts.append(f'<text x="{width - 8}" y="{legend_y}" text-anchor="end">{fmt_seconds(end)}, '
                 f'at most {peak} blocks</text>')
    return "".join(parts) + "</svg>"


def timeline_widget(reports: Mapping[str, ServeReport]):
    """Buttons that switch between the timelines of several runs (e.g. static and continuous),
    drawn on one time axis, each with its throughput and latencies. Returns an ``ipywidgets.VBox``."""
    import ipywidgets as widgets

    if not reports:
        raise ValueError("no reports to draw")
    end = max(s.start + s.seconds for r in reports.values() for s in r.timeline)
    views = []
    for name, r in reports.items():
        rows = [["tokens/s", f"{r.tokens_per_s:,.1f}"],
                ["time to first token, median", fmt_seconds(r.percentile(r.ttft, 50))],
                ["time between tokens, median / 90th percentile",
                 f"{fmt_seconds(r.percentile(r.inter_token, 50))} / {fmt_seconds(r.percentile(r.inter_token, 90))}"],
                ["forward passes", f"{r.steps:,}"],
                ["share of the batch's places that did work", f"{r.useful_row_steps / r.row_steps:.0%}"]]
        views.append(widgets.HTML(f'<div style="font-family:sans-serif;font-size:12px">'
                                  f'<b>{html.escape(name)}</b> ({BUILT_HERE})<br>{timeline_svg(r, until=end)}'
                                  f'{html_table(rows, ["", ""])}</div>'))
    buttons = widgets.ToggleButtons(options=[(name, i) for i, name in enumerate(reports)], index=0)
    stack = html_stack(views, selected_index=0)
    links = [link_index(buttons, stack)]
    box = widget_box([buttons, stack], f"timeline_widget({', '.join(reports)})", links)
    box.stack, box.buttons = stack, buttons
    return box


def plot_timeline(reports: Mapping[str, ServeReport], ax=None, *, blocks: bool = False):
    """The lanes of several runs (:func:`lanes`), one panel each on one time axis (matplotlib); with
    ``blocks=True`` a last panel shows the blocks of the pool in use after each step."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = list(reports)
    if ax is None:
        heights = [r.max_batch for r in reports.values()] + ([3] if blocks else [])
        _, ax = plt.subplots(len(heights), 1, figsize=(8, 1.0 + 0.45 * sum(heights)), layout="constrained",
                             sharex=True, squeeze=False, height_ratios=heights)
        ax = ax[:, 0]
    for a, name in zip(ax, names):
        r = reports[name]
        for step, row in zip(r.timeline, lanes(r)):
            for lane, (work, _) in enumerate(row):
                a.barh(lane, step.seconds, left=step.start, height=0.85, color=WORK_COLOURS[work], linewidth=0)
        a.set(yticks=range(r.max_batch), yticklabels=[f"lane {s}" for s in range(r.max_batch)], title=name)
        a.invert_yaxis()
    if blocks:
        for name in names:
            r = reports[name]
            ax[-1].step([s.start + s.seconds for s in r.timeline], [s.blocks_used for s in r.timeline], where="post",
                        label=name)
        ax[-1].set(ylabel="blocks in use")
        ax[-1].legend(fontsize=7)
    ax[-1].set_xlabel("seconds since the first request arrived")
    ax[0].legend(handles=[Patch(color=c, label=w) for w, c in WORK_COLOURS.items()], fontsize=7, ncol=5,
                 loc="lower right", bbox_to_anchor=(1, 1.15))
    return ax
