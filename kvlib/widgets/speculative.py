"""The speculative-decoding section's widget: what each verify step drafted, and what it kept.

For every step of one run, drawn in advance: the text so far (its end), the drafted tokens,
those the model accepted and those it rejected, and the token the model added of its own; a
slider moves through the steps. Works in the published book with no kernel running.
"""
from __future__ import annotations

import html
from typing import Callable, Sequence

from .html import CACHED, UNCACHED, html_table, slider_stack, widget_box

__all__ = ["draft_steps", "render_draft_step", "draft_steps_widget"]

OWN = "#7570b3"


def draft_steps(records: Sequence) -> list[dict]:
    """One dict per verify step of a speculative run (its ``records`` after the prefill): where the
    step started in the run's new tokens, its drafts, how many were accepted."""
    steps, at = [], 1                                   # the prefill wrote the first token
    for r in records[1:]:
        steps.append({"start": at, "draft": list(r.draft), "accepted": r.accepted})
        at += r.accepted + 1
    return steps


def _chip(text: str, colour: str, strike: bool = False) -> str:
    style = "text-decoration:line-through;" if strike else ""
    return (f'<span style="display:inline-block;margin:1px;padding:1px 4px;color:#fff;background:{colour};'
            f'{style}font-family:monospace;font-size:12px">{html.escape(text)}</span>')


def render_draft_step(steps: Sequence[dict], tokens: Sequence[int], decode: Callable[[list[int]], str],
                      index: int) -> str:
    """Step ``index``: the last words before it, each draft (accepted or rejected), the model's own token."""
    s = steps[index]
    before = decode(list(tokens[max(0, s["start"] - 12):s["start"]]))
    chips = [_chip(decode([d]), CACHED if i < s["accepted"] else UNCACHED, strike=i >= s["accepted"])
             for i, d in enumerate(s["draft"])]
    own = tokens[s["start"] + s["accepted"]] if s["start"] + s["accepted"] < len(tokens) else None
    chips.append(_chip(decode([own]) if own is not None else "(end)", OWN))
    legend = (f'<span style="color:{CACHED}">■</span> drafted, accepted &nbsp; <span style="color:{UNCACHED}">■'
              f'</span> drafted, rejected &nbsp; <span style="color:{OWN}">■</span> the model\'s own token')
    rows = [["tokens drafted", str(len(s["draft"]))], ["accepted", str(s["accepted"])],
            ["tokens written by this step", str(s["accepted"] + 1)]]
    return (f'<div style="font-family:sans-serif;font-size:12px"><b>Verify step {index + 1} of {len(steps)}</b>'
            f'<br>…{html.escape(before)}<br>{"".join(chips)}<br>{legend}{html_table(rows, ["", ""])}</div>')


def draft_steps_widget(records: Sequence, tokens: Sequence[int], decode: Callable[[list[int]], str], *,
                       start: int | None = None, interval: int = 900):
    """A slider over the verify steps of one speculative run (:func:`render_draft_step`, every view
    drawn in advance), at ``start`` (default: the first step that drafted). Returns an ``ipywidgets.VBox``."""
    import ipywidgets as widgets

    steps = draft_steps(records)
    if not steps:
        raise ValueError("no verify steps: the run wrote at most one token")
    views = [render_draft_step(steps, tokens, decode, i) for i in range(len(steps))]
    if start is None:
        start = next((i for i, s in enumerate(steps) if s["draft"]), 0)
    play, slider, stack, links = slider_stack([f"step {i + 1}" for i in range(len(steps))], views, "verify step",
                                              start, interval)
    box = widget_box([widgets.HBox([play, slider]), stack], f"draft_steps_widget({len(steps)} verify steps)", links)
    box.stack, box.slider, box.play = stack, slider, play
    return box
