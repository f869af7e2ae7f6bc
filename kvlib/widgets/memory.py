"""The memory calculator widget: model × context × batch × number format, with the cache
beside the weights (the sizes come from :mod:`kvlib.cache.sizes`).

It follows the slider widgets of :mod:`kvlib.widgets.context`: every combination of its
controls is drawn in advance and shown by ``Stack`` widgets linked to the controls with
``jslink``, so it works in the published HTML book without a Python kernel.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from ..cache.model_shapes import MODEL_SHAPES
from ..cache.sizes import bytes_per_number, crossover_tokens, kv_cache_bytes, weight_bytes
from ..measure.memory import fmt_bytes
from .html import html_style, link_index, widget_box
from .html import stack as html_stack

__all__ = ["MemoryPoint", "memory_point", "render_memory_view", "memory_calculator_widget",
           "CALCULATOR_CONTEXTS", "CALCULATOR_BATCHES", "CALCULATOR_DTYPES"]


# =======================================================================================
# The calculator: model × context × batch × dtype
# =======================================================================================

CALCULATOR_CONTEXTS = tuple(2 ** k for k in range(10, 18))          # 1,024 .. 131,072 tokens
CALCULATOR_BATCHES = (1, 8, 32)
CALCULATOR_DTYPES = (("float32", torch.float32), ("float16 / bfloat16", torch.float16), ("int8", torch.int8))
CACHE_COLOUR, WEIGHT_COLOUR = "#d95f02", "#7570b3"


@dataclass(frozen=True)
class MemoryPoint:
    """One setting of the calculator and what it gives."""

    model: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_params: int
    max_context: int
    context: int
    batch: int
    dtype_name: str
    bytes_per_number: int
    cache_bytes: int
    weight_bytes: int           # 16-bit weights
    crossover: float            # tokens per sequence where cache == weights at this batch and dtype

    @property
    def ratio(self) -> float:
        """Cache bytes ÷ weight bytes."""
        return self.cache_bytes / self.weight_bytes


def memory_point(shape, context: int, batch: int, dtype_name: str, dtype: torch.dtype | int) -> MemoryPoint:
    """The calculator's numbers for ``shape`` (a :class:`kvlib.cache.ModelShape`)."""
    cfg = shape.config
    return MemoryPoint(
        model=shape.name, n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        n_params=shape.n_params, max_context=shape.max_context, context=context, batch=batch,
        dtype_name=dtype_name, bytes_per_number=bytes_per_number(dtype),
        cache_bytes=kv_cache_bytes(cfg, context, batch, dtype), weight_bytes=weight_bytes(shape.n_params),
        crossover=crossover_tokens(cfg, shape.n_params, batch, cache_dtype=dtype))


def render_memory_view(p: MemoryPoint, bar_px: int = 300) -> str:
    """The static HTML of one setting: the formula with its numbers, the cache beside the
    weights as two bars, and from how many tokens on the cache is the heavier."""
    scale = max(p.cache_bytes, p.weight_bytes)
    bpn = f"{p.bytes_per_number} byte{'s' if p.bytes_per_number > 1 else ''}"

    def bar(label, value, colour):
        width = max(1, round(bar_px * value / scale))
        return (f'<tr><td>{label}</td><td style="text-align:right;padding:0 8px">{fmt_bytes(value)}</td>'
                f'<td><div style="background:{colour};width:{width}px;height:12px"></div></td></tr>')

    cross = math.floor(p.crossover) + 1
    notes = [f"cache ÷ weights: <b>{p.ratio:,.2f}×</b>; at batch {p.batch} in {html.escape(p.dtype_name)} the "
             f"cache outweighs the weights from {cross:,} tokens per sequence on"]
    if p.context > p.max_context:
        notes.append(f'<span style="color:#666">{html.escape(p.model)} was released for {p.max_context:,} '
                     f"tokens: this is the arithmetic of its shapes, not a setting it supports</span>")
    if p.bytes_per_number == 1:
        notes.append('<span style="color:#666">int8 numbers only; their scales add a little '
                     '(see the quantized cache)</span>')
    return (f'<div style="font-family:sans-serif;font-size:12px;line-height:1.5">'
            f'<b>{html.escape(p.model)}</b>: {p.context:,} tokens × batch {p.batch}, '
            f'{html.escape(p.dtype_name)} cache<br>'
            f'<code>2 × {p.n_layers} layers × {p.n_kv_heads} kv heads × {p.head_dim} × {bpn} × '
            f'{p.context:,} tokens × {p.batch} = {p.cache_bytes:,} bytes</code>'
            f'<table style="border-collapse:collapse;margin:4px 0">'
            f'{bar("KV cache", p.cache_bytes, CACHE_COLOUR)}'
            f'{bar(f"weights ({p.n_params / 1e9:.2f}B params, 16-bit)", p.weight_bytes, WEIGHT_COLOUR)}'
            f'</table>{"<br>".join(notes)}</div>')


def memory_calculator_widget(shapes: Mapping | None = None, *, contexts: Sequence[int] = CALCULATOR_CONTEXTS,
                             batches: Sequence[int] = CALCULATOR_BATCHES,
                             dtypes: Sequence[tuple[str, torch.dtype | int]] = CALCULATOR_DTYPES,
                             start: tuple[str, int, int, str] | None = None):
    """A KV-cache calculator: a model dropdown, a context slider, batch and dtype buttons.

    Every combination is drawn in advance. The views sit in nested ``Stack`` widgets (contexts,
    then batch sizes, then dtypes, then models), each ``jslink``-ed to its control, so the
    widget works in a static HTML page. ``shapes`` defaults to
    :data:`kvlib.cache.MODEL_SHAPES`; ``start`` is ``(model, context, batch, dtype name)``.
    Returns an ``ipywidgets.VBox``; its ``views`` maps ``(model, context, batch, dtype name)``
    to the view drawn for that choice.
    """
    import ipywidgets as widgets

    shapes = dict(MODEL_SHAPES if shapes is None else shapes)
    contexts, batches, dtypes = list(contexts), list(batches), list(dtypes)
    if not shapes or not contexts or not batches or not dtypes:
        raise ValueError("the calculator needs at least one model, context, batch size and dtype")
    names = list(shapes)
    i0 = _start_indices(start or (names[0], contexts[0], batches[0], dtypes[0][0]), names, contexts, batches, dtypes)
    model_dd, context_sl, batch_tb, dtype_tb = _calculator_controls(widgets, names, contexts, batches, dtypes, i0)
    # Nesting order: the slider drives the outermost Stack (one link), then batch, dtype, model.
    levels = [(context_sl, contexts, i0[1]), (batch_tb, batches, i0[2]),
              (dtype_tb, [d for d, _ in dtypes], i0[3]), (model_dd, names, i0[0])]
    top, views, links = _view_stacks(widgets, levels, shapes, dict(dtypes))
    box = widget_box([model_dd, context_sl, _labelled(widgets, "batch size", batch_tb),
                      _labelled(widgets, "cache dtype", dtype_tb), top],
                     f"memory_calculator_widget({len(names)} models × {len(contexts)} contexts × "
                     f"{len(batches)} batch sizes × {len(dtypes)} dtypes = {len(views)} views)", links)
    box.stack, box.views = top, views
    box.model, box.context, box.batch, box.dtype = model_dd, context_sl, batch_tb, dtype_tb
    return box


def _start_indices(start: tuple[str, int, int, str], names: list[str], contexts: list[int], batches: list[int],
                   dtypes: list[tuple[str, torch.dtype | int]]) -> tuple[int, int, int, int]:
    """Where ``start`` (model, context, batch, dtype name) lies in each list of choices; a
    ``ValueError`` when it is not among them."""
    try:
        return (names.index(start[0]), contexts.index(start[1]), batches.index(start[2]),
                [d for d, _ in dtypes].index(start[3]))
    except ValueError:
        raise ValueError(f"start={start!r} is not one of the calculator's choices") from None


def _calculator_controls(widgets, names: list[str], contexts: list[int], batches: list[int],
                         dtypes: list[tuple[str, torch.dtype | int]], i0: tuple[int, int, int, int]) -> tuple:
    """The model dropdown, context slider, batch and dtype buttons, each set to its index in ``i0``
    (model, context, batch, dtype); each control's value is the index of its choice."""
    label = {"description_width": "90px"}
    model_dd = widgets.Dropdown(options=[(n, i) for i, n in enumerate(names)], index=i0[0], description="model",
                                style=label, layout=widgets.Layout(width="320px"))
    context_sl = widgets.SelectionSlider(options=[(f"{n:,} tokens", i) for i, n in enumerate(contexts)],
                                         index=i0[1], description="context", continuous_update=True,
                                         style=label, layout=widgets.Layout(width="460px"))
    batch_tb = widgets.ToggleButtons(options=[(f"{b}", i) for i, b in enumerate(batches)], index=i0[2],
                                     style={"button_width": "60px"})
    dtype_tb = widgets.ToggleButtons(options=[(d, i) for i, (d, _) in enumerate(dtypes)], index=i0[3],
                                     style={"button_width": "150px"})
    return model_dd, context_sl, batch_tb, dtype_tb


def _labelled(widgets, text: str, control):
    """``control`` after a label in line with it, aligned like the other controls' descriptions."""
    return widgets.HBox([widgets.HTML(f'<div style="text-align:right;padding-right:8px">{text}</div>',
                                      layout=widgets.Layout(width="98px")), control])


def _view_stacks(widgets, levels: list[tuple], shapes: Mapping, dtype_of: Mapping) -> tuple:
    """Every view, in ``Stack`` widgets nested in the order of ``levels`` ((control, values, selected
    index) each, outermost first), each stack ``jslink``-ed to its control. Returns the outermost
    stack, the views by (model, context, batch, dtype name), and the links."""
    row = widgets.Layout(width="auto")
    links = []
    leaf_layout, leaf_style = widgets.Layout(), html_style()   # shared by every view: a smaller page
    views: dict[tuple[str, int, int, str], object] = {}

    def build(depth: int, chosen: tuple):
        if depth == len(levels):
            context, batch, dname, name = chosen
            view = widgets.HTML(render_memory_view(memory_point(shapes[name], context, batch, dname, dtype_of[dname])),
                                layout=leaf_layout, style=leaf_style)
            views[(name, context, batch, dname)] = view
            return view
        control, values, selected = levels[depth]
        stack = html_stack([build(depth + 1, chosen + (v,)) for v in values], selected_index=selected, layout=row)
        links.append(link_index(control, stack))
        return stack

    return build(0, ()), views, links
