"""The closing page's widget: the chapter's levers together, for a model, a machine, a number of
users and a context length the reader chooses.

Every combination is computed in advance by :func:`kvlib.measure.levers.levers` and drawn as
an HTML table, one row per lever with a link to the section that derived it. The tables sit
in nested ``Stack`` widgets (contexts outermost, then users, machines, models), each
``jslink``-ed to its control, so that the widget works in the published book with no kernel.
:func:`plot_levers` draws one scenario's rows as a picture: what a decode step reads, lever by
lever, and the tokens per second it gives.
"""
from __future__ import annotations

import html
from typing import Sequence

from ..cache.model_shapes import MODEL_SHAPES
from ..measure.levers import ROOFLINE_SECTIONS, LeverRow, Scenario, fmt_gb, levers, scenario_notes
from ..measure.roofline import REFERENCE_ACCELERATORS
from .html import html_style, link_index, widget_box
from .html import stack as html_stack

__all__ = ["LEVER_USERS", "LEVER_CONTEXTS", "SHARED_PREFIX", "ALPHAS", "DRAFTS", "PREFIXES", "render_levers_view",
           "levers_widget", "assumptions_widget", "plot_levers", "WEIGHTS_COLOUR", "CACHES_COLOUR"]

LEVER_USERS = (1, 8, 32, 128)
LEVER_CONTEXTS = (2048, 8192, 32768)
SHARED_PREFIX = 1024                     # a system prompt of 1,024 tokens, the same for every user
ALPHAS = (0.3, 0.5, 0.7, 0.9)            # the assumptions widget's acceptances, drafts and shared prefixes
DRAFTS = (2, 4, 8)
PREFIXES = (0, 1024, 4096)

WEIGHTS_COLOUR, CACHES_COLOUR = "#4c72b0", "#dd8452"      # the two parts of a step's read, in the figure

_CELL = ('<th>lever (section)</th><th>weights</th><th>cache per user</th><th>users that fit</th><th>batch</th>'
         '<th>step</th><th>tok/s per user</th><th>tok/s in all</th><th>bound</th>')


def _row_html(r) -> str:
    link = f'<a href="{r.lever.page}.html">{html.escape(r.lever.name)} ({r.lever.section})</a>'
    if r.step_seconds is None:
        timing = '<td colspan="4">no user fits</td>'
    else:
        timing = (f"<td>{r.step_seconds * 1e3:.1f} ms</td><td>{r.tokens_per_second_per_user:,.1f}</td>"
                  f"<td>{r.tokens_per_second:,.0f}</td><td>{r.bound}</td>")
    return (f'<tr><td style="text-align:left">({r.lever.key}) {link}</td><td>{fmt_gb(r.weight_bytes)}</td>'
            f"<td>{fmt_gb(r.cache_bytes_per_user)}</td><td>{r.fit:,}</td><td>{r.batch:,}</td>{timing}</tr>")


def render_levers_view(scenario: Scenario) -> str:
    """The HTML table of ``scenario``'s levers (:func:`kvlib.measure.levers.levers`): a line that
    states the scenario and the machine's source, then one row per lever, linked to its section."""
    s, m = scenario, scenario.machine
    rows = levers(s)
    roofline = " and ".join(f'<a href="{page}.html">{n}</a>' for n, page in ROOFLINE_SECTIONS)
    notes = "".join(f"<br><i>{html.escape(n)}</i>" for n in scenario_notes(s))
    return (f'<div style="font-family:sans-serif;font-size:12px"><b>{html.escape(s.model)}</b> on '
            f"<b>{html.escape(m.name)}</b> ({m.memory_bytes / 1e9:g} GB): {s.users:,} user{'s' * (s.users > 1)} at "
            f"{s.context:,} tokens, {s.shared_prefix:,} of them a shared system prompt; drafts: k = {s.drafts}, "
            f"α = {s.alpha:g}. Step times: the roofline (sections {roofline}).{notes}"
            f'<table cellpadding="3" style="border-collapse:collapse;text-align:right;margin-top:4px">'
            f'<tr>{_CELL}</tr>{"".join(_row_html(r) for r in rows)}</table>'
            f'<span style="color:#666">Figures: {html.escape(m.source)}</span></div>')


def levers_widget(models: Sequence[str] | None = None, machines: Sequence[str] | None = None, *,
                  users: Sequence[int] = LEVER_USERS, contexts: Sequence[int] = LEVER_CONTEXTS,
                  shared_prefix: int = SHARED_PREFIX, alpha: float = 0.7, drafts: int = 4,
                  start: tuple[str, str, int, int] | None = None):
    """A model dropdown, a machine dropdown (:data:`REFERENCE_ACCELERATORS`), users buttons and a
    context slider over :func:`render_levers_view` of every combination, drawn in advance.

    ``start`` is ``(model, machine, users, context)`` (default: the first of each). Returns an
    ``ipywidgets.VBox``; ``box.views`` maps ``(model, machine, users, context)`` to its view.
    """
    import ipywidgets as widgets

    models = list(MODEL_SHAPES if models is None else models)
    machines = list(REFERENCE_ACCELERATORS if machines is None else machines)
    users, contexts = list(users), list(contexts)
    if not (models and machines and users and contexts):
        raise ValueError("the widget needs at least one model, machine, number of users and context")
    start = start or (models[0], machines[0], users[0], contexts[0])
    try:
        i0 = (models.index(start[0]), machines.index(start[1]), users.index(start[2]), contexts.index(start[3]))
    except ValueError:
        raise ValueError(f"start={start!r} is not one of the widget's choices") from None
    controls = _controls(widgets, models, machines, users, contexts, i0)
    levels = [(controls[3], contexts, i0[3]), (controls[2], users, i0[2]), (controls[1], machines, i0[1]),
              (controls[0], models, i0[0])]
    extra = dict(shared_prefix=shared_prefix, alpha=alpha, drafts=drafts)

    def view(chosen: tuple) -> tuple[tuple, str]:
        context, users_, machine, model = chosen
        return (model, machine, users_, context), render_levers_view(Scenario(model, machine, users_, context, **extra))

    top, views, links = _stacks(widgets, levels, view)
    box = widget_box([*controls[:2], _labelled(widgets, "users", controls[2]), controls[3], top],
                     f"levers_widget({len(models)} models × {len(machines)} machines × {len(users)} user counts "
                     f"× {len(contexts)} contexts = {len(views)} views)", links)
    box.stack, box.views = top, views
    box.model, box.machine, box.users, box.context = controls
    return box


def _controls(widgets, models: list, machines: list, users: list, contexts: list, i0: tuple) -> tuple:
    """The model and machine dropdowns, users buttons and context slider, each at its index in ``i0``."""
    label = {"description_width": "90px"}
    model = widgets.Dropdown(options=[(n, i) for i, n in enumerate(models)], index=i0[0], description="model",
                             style=label, layout=widgets.Layout(width="320px"))
    machine = widgets.Dropdown(options=[(n, i) for i, n in enumerate(machines)], index=i0[1], description="machine",
                               style=label, layout=widgets.Layout(width="320px"))
    user = widgets.ToggleButtons(options=[(f"{u:,}", i) for i, u in enumerate(users)], index=i0[2],
                                 style={"button_width": "60px"})
    context = widgets.SelectionSlider(options=[(f"{n:,} tokens", i) for i, n in enumerate(contexts)], index=i0[3],
                                      description="context", continuous_update=True, style=label,
                                      layout=widgets.Layout(width="460px"))
    return model, machine, user, context


def _labelled(widgets, text: str, control):
    """``control`` after a label aligned with the other controls' descriptions."""
    return widgets.HBox([widgets.HTML(f'<div style="text-align:right;padding-right:8px">{text}</div>',
                                      layout=widgets.Layout(width="98px")), control])


def _stacks(widgets, levels: list[tuple], view) -> tuple:
    """Every view in ``Stack`` widgets nested in the order of ``levels`` ((control, values,
    selected index), outermost first), each stack ``jslink``-ed to its control; ``view(chosen)``,
    with ``chosen`` a value of every level in that order, returns ``(key, html)``. Returns the
    outermost stack, the views by key, and the links."""
    links, views = [], {}
    leaf_layout, leaf_style = widgets.Layout(), html_style()   # shared: a smaller page
    row = widgets.Layout(width="auto")

    def build(depth: int, chosen: tuple):
        if depth == len(levels):
            key, text = view(chosen)
            views[key] = leaf = widgets.HTML(text, layout=leaf_layout, style=leaf_style)
            return leaf
        control, values, selected = levels[depth]
        stack = html_stack([build(depth + 1, chosen + (v,)) for v in values], selected_index=selected, layout=row)
        links.append(link_index(control, stack))
        return stack

    return build(0, ()), views, links


def assumptions_widget(model: str = "Llama-3-8B", machine: str = "NVIDIA H100 SXM", users: int = 32,
                       context: int = 8192, *, alphas: Sequence[float] = ALPHAS, drafts: Sequence[int] = DRAFTS,
                       prefixes: Sequence[int] = PREFIXES, start: tuple[float, int, int] = (0.7, 4, 1024)):
    """The levers of one scenario under the assumptions a reader moves: the acceptance α (a slider),
    the drafts per step k and the shared prefix (buttons), every combination drawn in advance
    (:func:`render_levers_view`). Returns an ``ipywidgets.VBox``; ``box.views`` maps ``(alpha,
    drafts, shared prefix)`` to its view."""
    import ipywidgets as widgets

    alphas, drafts, prefixes = list(alphas), list(drafts), list(prefixes)
    try:
        i0 = (alphas.index(start[0]), drafts.index(start[1]), prefixes.index(start[2]))
    except ValueError:
        raise ValueError(f"start={start!r} is not one of the widget's choices") from None
    label = {"description_width": "90px"}
    alpha = widgets.SelectionSlider(options=[(f"{a:g}", i) for i, a in enumerate(alphas)], index=i0[0],
                                    description="acceptance α", style=label, layout=widgets.Layout(width="360px"))
    k = widgets.ToggleButtons(options=[(str(d), i) for i, d in enumerate(drafts)], index=i0[1],
                              style={"button_width": "50px"})
    prefix = widgets.ToggleButtons(options=[(f"{p:,}", i) for i, p in enumerate(prefixes)], index=i0[2],
                                   style={"button_width": "60px"})

    def view(chosen: tuple) -> tuple[tuple, str]:
        a, d, p = chosen
        return (a, d, p), render_levers_view(Scenario(model, machine, users, context, p, a, d))

    levels = [(alpha, alphas, i0[0]), (k, drafts, i0[1]), (prefix, prefixes, i0[2])]
    top, views, links = _stacks(widgets, levels, view)
    box = widget_box([alpha, _labelled(widgets, "drafts k", k), _labelled(widgets, "shared prefix", prefix), top],
                     f"assumptions_widget({len(alphas)} acceptances × {len(drafts)} drafts × {len(prefixes)} "
                     f"shared prefixes = {len(views)} views)", links)
    box.stack, box.views, box.alpha, box.drafts, box.prefix = top, views, alpha, k, prefix
    return box


def plot_levers(rows: Sequence[LeverRow], ax=None, *, title: str | None = None):
    """The rows of :func:`kvlib.measure.levers.levers` as a picture: one horizontal bar per lever,
    (a) at the top, as long as the bytes one decode step of that row's batch reads, split into what
    it reads once (the weights, and a shared prefix read once) and what it reads once per row (the
    batch's caches); beside each bar, the tokens per second in all, the batch, and the bound where
    the step is compute-bound (then its time is its arithmetic, not its read). A row where no
    user fits has no bar. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4), layout="constrained")
    ys = list(range(len(rows)))
    once = [r.read_weight_bytes / 1e9 if r.batch else 0.0 for r in rows]
    caches = [r.batch * r.read_cache_bytes_per_row / 1e9 for r in rows]
    ax.barh(ys, once, color=WEIGHTS_COLOUR, height=0.6)
    ax.barh(ys, caches, left=once, color=CACHES_COLOUR, height=0.6)
    end = max(a + b for a, b in zip(once, caches)) or 1.0
    for y, r, a, b in zip(ys, rows, once, caches):
        if not r.batch:
            text = "no user fits"
        else:
            text = f"{r.tokens_per_second:,.0f} tok/s, batch {r.batch}"
            if r.bound == "compute":
                text += " (compute-bound)"
        ax.text(a + b + 0.01 * end, y, text, va="center", fontsize=8)
    ax.set_yticks(ys, [f"({r.lever.key}) {r.lever.name}" for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, end * 1.45)
    ax.set_xlabel("GB one decode step reads (the roofline's step time is this over the bandwidth, "
                  "while memory-bound)", fontsize=8)
    ax.legend(handles=[Patch(color=WEIGHTS_COLOUR, label="read once a step: the weights"),
                       Patch(color=CACHES_COLOUR, label="read once per row: the batch's caches")],
              fontsize=8, loc="lower right")
    ax.set_title(title or "What one decode step reads, lever by lever, and the tokens per second it gives",
                 fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return ax
