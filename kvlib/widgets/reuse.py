"""The reuse section's widget: a conversation's block table, turn by turn (a slider over the turns);
and its figure of a small pool after each request of a cycle (:func:`plot_pool_steps`).

Every turn's request holds a table of blocks of the engine's pool. Drawn in advance for each
turn: the blocks it took from the prefix cache, those it computed, and the partly filled last
block, each with its block id, so that the slider shows the table growing while the earlier
blocks stay the same blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .html import CACHED, UNCACHED, html_table, slider_stack, widget_box

__all__ = ["TurnBlocks", "turn_blocks", "render_turn_blocks", "conversation_blocks_widget", "PoolStep", "pool_steps",
           "plot_pool_steps"]

PARTIAL = "#7570b3"


@dataclass(frozen=True)
class TurnBlocks:
    """One turn of a conversation as the engine held it: its block table when it finished, how
    many of its prompt tokens came from the cache, its prompt and answer lengths."""

    table: tuple[int, ...]
    cached_tokens: int
    prompt_tokens: int
    answer_tokens: int
    block_size: int

    @property
    def cached_blocks(self) -> int:
        return self.cached_tokens // self.block_size

    @property
    def full_blocks(self) -> int:
        """Blocks filled by the tokens computed for this turn (the last answer token is never fed)."""
        return (self.prompt_tokens + self.answer_tokens - 1) // self.block_size


def turn_blocks(turns: Sequence, block_size: int = 16) -> list[TurnBlocks]:
    """:class:`TurnBlocks` of each :class:`kvlib.serve.chat.Turn`."""
    return [TurnBlocks(tuple(t.report.block_tables[0]), t.cached_tokens, t.prompt_tokens, len(t.answer_ids),
                       block_size) for t in turns]


def render_turn_blocks(points: Sequence[TurnBlocks], index: int) -> str:
    """The block table of turn ``index`` as HTML: one box per block, its id written in."""
    p = points[index]
    boxes = []
    for i, block in enumerate(p.table):
        colour = CACHED if i < p.cached_blocks else (UNCACHED if i < p.full_blocks else PARTIAL)
        boxes.append(f'<span style="display:inline-block;width:30px;margin:1px;padding:3px 0;text-align:center;'
                     f'color:#fff;background:{colour};font-size:11px">{block}</span>')
    legend = (f'<span style="color:{CACHED}">■</span> from the cache &nbsp; <span style="color:{UNCACHED}">■</span> '
              f'computed for this turn &nbsp; <span style="color:{PARTIAL}">■</span> partly filled (not shared)')
    rows = [["prompt tokens", f"{p.prompt_tokens:,}"], ["of which from the cache", f"{p.cached_tokens:,}"],
            ["answer tokens", f"{p.answer_tokens:,}"], ["blocks in the table", f"{len(p.table):,}"]]
    return (f'<div style="font-family:sans-serif;font-size:12px"><b>Turn {index + 1}</b>: the request\'s block '
            f'table (block ids of the pool, {p.block_size} tokens each)<br>{"".join(boxes)}<br>{legend}'
            f'{html_table(rows, ["", ""])}</div>')


def conversation_blocks_widget(points: Sequence[TurnBlocks], *, start: int = 0, interval: int = 1500):
    """A slider over the turns of a conversation, each turn's block table drawn in advance
    (:func:`render_turn_blocks`). Returns an ``ipywidgets.VBox``."""
    import ipywidgets as widgets

    points = list(points)
    if not points:
        raise ValueError("no turns: hold a conversation first (kvlib.serve.chat.Chat)")
    views = [render_turn_blocks(points, i) for i in range(len(points))]
    play, slider, stack, links = slider_stack([f"turn {i + 1}" for i in range(len(points))], views, "turn", start,
                                              interval)
    box = widget_box([widgets.HBox([play, slider]), stack], f"conversation_blocks_widget({len(points)} turns)", links)
    box.stack, box.slider, box.play = stack, slider, play
    return box


@dataclass(frozen=True)
class PoolStep:
    """The pool of blocks after one request served alone on an engine with prefix caching: its label
    (the service it belongs to), its block table, how many of its blocks it took from the cache, the
    blocks it computed over an evicted block, and which service's cached blocks every block holds."""

    label: str
    table: tuple[int, ...]
    cached_blocks: int
    evicted: frozenset[int]
    holds: tuple[str, ...]          # per block id: the label of the service whose cached block it holds, or ""


def pool_steps(engine, requests: Sequence, labels: Sequence[str]) -> list[PoolStep]:
    """Serve ``requests`` one at a time on ``engine`` (a fixed pool, ``prefix_caching=True``) and record
    the pool after each (:class:`PoolStep`). A computed block that held another request's cached key
    before this one was evicted for it."""
    blocks, holds = engine.blocks, [""] * engine.blocks.capacity
    out = []
    for request, label in zip(requests, labels):
        report = engine.serve([request])
        table = tuple(report.block_tables[0])
        hits = report.cached_tokens // blocks.block_size
        evicted = frozenset(b for b in table[hits:] if holds[b] and holds[b] != label)
        for b in table:
            holds[b] = label
        holds = [h if blocks.is_cached(b) else "" for b, h in enumerate(holds)]
        out.append(PoolStep(label, table, hits, evicted, tuple(holds)))
    return out


def plot_pool_steps(steps: Sequence[PoolStep], ax=None):
    """One row per request, one cell per block of the pool: the request's blocks taken from the cache,
    computed, computed over an evicted block; every other block with the service whose cached block
    it holds (its letter), or empty. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.35 * len(steps) + 1.2), layout="constrained")
    colour = {"hit": CACHED, "new": UNCACHED, "evicted": "#d62728", "held": "#d9d9d9", "free": "#ffffff"}
    for row, step in enumerate(steps):
        for b, held in enumerate(step.holds):
            kind = ("evicted" if b in step.evicted else "hit" if b in step.table[:step.cached_blocks] else
                    "new" if b in step.table else "held" if held else "free")
            ax.add_patch(plt.Rectangle((b, row), 0.95, 0.9, color=colour[kind], ec="#999999", lw=0.3))
            if held and kind != "free":
                ax.text(b + 0.47, row + 0.45, held, ha="center", va="center", fontsize=6,
                        color="white" if kind in ("hit", "new", "evicted") else "#444444")
    ax.set(xlim=(0, len(steps[0].holds)), ylim=(len(steps), 0), xlabel="block of the pool",
           yticks=[r + 0.45 for r in range(len(steps))],
           yticklabels=[f"request {r + 1} ({s.label})" for r, s in enumerate(steps)])
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(handles=[Patch(color=colour[k], label=t) for k, t in [("hit", "taken from the cache"),
              ("new", "computed"), ("evicted", "computed over an evicted block"), ("held", "cached, held (its service)")]],
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25 / max(1, len(steps) / 9)), ncol=4)
    return ax
