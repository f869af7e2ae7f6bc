"""The quantization section's widget: the values a format can represent, laid over a real
weight histogram, with a slider over the bits and buttons for the group size.

Every combination is drawn in advance and linked to the controls in the browser
(:mod:`kvlib.widgets.html`), so it works in the published book with no kernel running.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .html import CACHED, UNCACHED, html_table, link_index, widget_box
from .html import stack as html_stack

__all__ = ["GridPoint", "grid_point", "render_grid_view", "quant_grid_widget"]


@dataclass(frozen=True)
class GridPoint:
    """One format on one weight matrix: the histogram of one group and the format's levels there,
    and the error of the whole matrix."""

    bits: int
    group: int | None                 # weights per scale along a row; None: one scale per row
    counts: tuple[int, ...]           # histogram of the shown group's weights
    edges: tuple[float, float]        # its range
    levels: tuple[float, ...]         # the values the format can represent in that group
    rms_error: float                  # over the whole matrix
    bits_per_weight: float            # with a 16-bit scale and a 16-bit zero per group


def grid_point(weight: torch.Tensor, bits: int, group: int | None, *, shown_row: int = 0, bins: int = 60) -> GridPoint:
    """Asymmetric ``bits``-bit quantization of ``weight`` ``(out, in)``, a scale and a zero (min..max)
    per ``group`` inputs (per row when ``group`` is None), summed up for :func:`render_grid_view`."""
    w = weight.detach().float()
    width = w.shape[1] if group is None else group
    g = w.reshape(w.shape[0], -1, width)                                        # (out, groups, width)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    steps = 2 ** bits - 1
    scale = ((hi - lo) / steps).clamp(min=1e-12)
    back = torch.round((g - lo) / scale).clamp(0, steps) * scale + lo
    shown = g[shown_row, 0]
    a, b = float(lo[shown_row, 0]), float(hi[shown_row, 0])
    counts = torch.histc(shown, bins=bins, min=a, max=b)
    levels = tuple(a + k * float(scale[shown_row, 0]) for k in range(steps + 1))
    return GridPoint(bits, group, tuple(int(c) for c in counts), (a, b), levels,
                     float(((back - g) ** 2).mean().sqrt()), bits + 32 / width)


def _grid_svg(p: GridPoint, width: int = 460, height: int = 150) -> str:
    left, bottom, top = 10, 22, 8
    a, b = p.edges
    span = (b - a) or 1.0
    x = lambda v: left + (v - a) / span * (width - 2 * left)                    # noqa: E731
    peak = max(p.counts) or 1
    bar_w = (width - 2 * left) / len(p.counts)
    parts = [f'<svg width="{width}" height="{height}" style="font-family:sans-serif;font-size:10px">']
    for i, c in enumerate(p.counts):
        h = c / peak * (height - bottom - top)
        parts.append(f'<rect x="{left + i * bar_w:.2f}" y="{height - bottom - h:.2f}" width="{bar_w:.2f}" '
                     f'height="{h:.2f}" fill="{CACHED}" opacity="0.7"/>')
    stride = max(1, len(p.levels) // 64)                                        # 8 bits: draw every 4th level
    for v in p.levels[::stride]:
        parts.append(f'<line x1="{x(v):.2f}" y1="{top}" x2="{x(v):.2f}" y2="{height - bottom}" '
                     f'stroke="{UNCACHED}" stroke-width="0.8"/>')
    parts.append(f'<text x="{left}" y="{height - 6}">{a:.3f}</text>'
                 f'<text x="{width - left}" y="{height - 6}" text-anchor="end">{b:.3f}</text>')
    return "".join(parts) + "</svg>"


def render_grid_view(p: GridPoint, name: str) -> str:
    group = "one scale per row" if p.group is None else f"groups of {p.group}"
    drawn = "every level" if len(p.levels) <= 64 else f"every {len(p.levels) // 64}th level"
    rows = [["levels in a group", f"{len(p.levels):,}"], ["bits per weight (with scale and zero)", f"{p.bits_per_weight:.2f}"],
            ["RMS error over the matrix", f"{p.rms_error:.2e}"]]
    return (f'<div style="font-family:sans-serif;font-size:12px;line-height:1.3"><b>{p.bits} bits, {group}</b> '
            f'(the first group of row 0 of {name}: bars, the weights; lines, {drawn} the format can represent)<br>'
            f'{_grid_svg(p)}{html_table(rows, ["", ""])}</div>')


def quant_grid_widget(weight: torch.Tensor, name: str, bits: Sequence[int] = (2, 3, 4, 8),
                      groups: Sequence[int | None] = (32, 128, None)):
    """A slider over ``bits`` and buttons over ``groups``: for each pair, the levels of that format
    over the histogram of one group of ``weight`` and the error over the whole matrix. Returns
    an ``ipywidgets.VBox``; its ``points`` maps ``(bits, group)`` to the numbers drawn."""
    import ipywidgets as widgets

    bits, groups = list(bits), list(groups)
    points = {(b, g): grid_point(weight, b, g) for b in bits for g in groups}
    slider = widgets.SelectionSlider(options=[(f"{b} bits", i) for i, b in enumerate(bits)], index=bits.index(4) if 4 in bits else 0,
                                     description="bits", continuous_update=True, layout=widgets.Layout(width="360px"))
    buttons = widgets.ToggleButtons(options=[("per row" if g is None else f"groups of {g}", i) for i, g in enumerate(groups)],
                                    index=0, style={"button_width": "110px"})
    links, inner = [], []
    for b in bits:
        stack = html_stack([widgets.HTML(render_grid_view(points[(b, g)], name)) for g in groups], selected_index=0)
        links.append(link_index(buttons, stack))
        inner.append(stack)
    outer = html_stack(inner, selected_index=slider.index)
    links.append(link_index(slider, outer))
    box = widget_box([slider, buttons, outer], f"quant_grid_widget({len(bits)} bit widths × {len(groups)} groupings)", links)
    box.stack, box.slider, box.buttons, box.points = outer, slider, buttons, points
    return box
