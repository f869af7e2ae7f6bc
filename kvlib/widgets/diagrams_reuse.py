"""Figures of the reuse section (section 9): a prompt's tokens in the engine's blocks, and two
ways of finding a shared prefix (chained block keys, a radix tree), drawn over the same prompts.

Each ``plot_*`` function takes its data and returns a matplotlib Axes; :func:`radix_tree`
builds the tree :func:`plot_radix_tree` draws.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Sequence

from .html import CACHED, UNCACHED

__all__ = ["token_label", "plot_token_blocks", "chained_keys", "plot_hashed_blocks", "radix_tree",
           "plot_radix_tree"]

# One colour per message of a conversation (system, question, answer, ...), light enough to write on.
MESSAGE_COLOURS = ("#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb", "#fcbba1", "#d9d9d9")
PARTIAL = "#bdbdbd"


def token_label(text: str, width: int = 7) -> str:
    """A decoded token as a slot of a figure shows it: a space as ``·``, a newline as ``⏎``,
    cut to ``width`` characters (``…`` at the end when cut)."""
    shown = text.replace(" ", "·").replace("\n", "⏎").replace("\t", "→")
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def _text(text: str, width: int) -> str:
    """A run of tokens as a box shows it: newlines as ``⏎``, cut to ``width`` characters."""
    shown = text.replace("\n", "⏎").strip()
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def _axes(ax, figsize):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def plot_token_blocks(texts: Sequence[str], block_size: int, cached: int,
                      segments: Sequence[tuple[str, int, int]], ax=None, *, title: str | None = None):
    """A prompt's tokens in the engine's blocks: one row per block, one slot per token with its
    decoded text (``texts``, one string per token). Each slot is coloured by the message it belongs
    to (``segments``: ``(label, start, end)`` token ranges); the first ``cached`` tokens, taken from
    the cache, are drawn with a dark frame and the others, computed, with a light one; a block's
    row says which it is. A message that does not start at a slot 0 is cut by a block boundary."""
    from matplotlib.patches import Patch, Rectangle

    n = len(texts)
    if block_size < 1 or n == 0:
        raise ValueError(f"need tokens and a positive block size, got {n} tokens, block_size {block_size}")
    if not 0 <= cached <= n:
        raise ValueError(f"cached must lie between 0 and the {n} tokens, got {cached}")
    rows = -(-n // block_size)
    ax = _axes(ax, (min(10.0, 0.6 * block_size + 1.6), 0.42 * rows + 1.3))
    colour_of = {}
    for i, (label, start, end) in enumerate(segments):
        colour_of[label] = MESSAGE_COLOURS[i % len(MESSAGE_COLOURS)]
        if not 0 <= start <= end <= n:
            raise ValueError(f"segment {label!r} ({start}, {end}) lies outside the {n} tokens")

    def segment(t: int) -> str | None:
        return next((label for label, start, end in segments if start <= t < end), None)

    for t, text in enumerate(texts):
        row, col = divmod(t, block_size)
        label = segment(t)
        face = colour_of.get(label, "#ffffff")
        from_cache = t < cached
        ax.add_patch(Rectangle((col, row), 0.94, 0.86, facecolor=face, edgecolor=CACHED if from_cache else UNCACHED,
                               lw=1.6 if from_cache else 0.8, ls="-" if from_cache else "--"))
        ax.text(col + 0.47, row + 0.43, token_label(text), ha="center", va="center", fontsize=5.5, family="monospace")
        if t > 0 and label != segment(t - 1) and col != 0:           # a message starts inside a block
            ax.plot([col - 0.03, col - 0.03], [row - 0.05, row + 0.91], color="#d62728", lw=2)
    full = n // block_size
    ax.set(xlim=(-0.1, block_size), ylim=(rows, -0.15), xticks=[c + 0.47 for c in range(block_size)],
           xticklabels=[str(c) for c in range(block_size)], yticks=[r + 0.43 for r in range(rows)],
           xlabel="slot of the block")
    names = []
    for r in range(rows):
        kind = ("from the cache" if (r + 1) * block_size <= cached else
                "computed" if r < full else "computed, partly filled")
        names.append(f"block {r}: {kind}")
    ax.set_yticklabels(names, fontsize=7)
    ax.tick_params(axis="x", labelsize=6)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=colour_of[label], edgecolor="#999999", label=label) for label, _, _ in segments]
    handles += [Patch(facecolor="white", edgecolor=CACHED, lw=1.6, label="taken from the cache"),
                Patch(facecolor="white", edgecolor=UNCACHED, ls="--", label="computed"),
                Patch(facecolor="#d62728", label="a message starts inside a block")]
    ax.legend(handles=handles, fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.9 / max(rows, 1) - 0.06),
              ncol=4, frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def chained_keys(tokens: Sequence[int], block_size: int) -> list[str]:
    """Short chained keys of the full blocks of ``tokens`` (SHA-256 of the previous key and the
    block's tokens, 4 hex digits shown): what a figure writes in each block."""
    keys, previous = [], b""
    for i in range(len(tokens) // block_size):
        block = ",".join(map(str, tokens[i * block_size:(i + 1) * block_size])).encode()
        previous = hashlib.sha256(previous + b"|" + block).digest()
        keys.append(previous.hex()[:4])
    return keys


def plot_hashed_blocks(sequences: Sequence[Sequence[int]], block_size: int, decode: Callable[[list[int]], str],
                       ax=None, *, labels: Sequence[str] | None = None):
    """The prompts ``sequences`` as the engine keys them: one row per prompt, one box per block of
    ``block_size`` tokens with its chained key and its text; a full block whose key an earlier
    prompt already has is found in the cache (dark), a new one is computed (light), and the last,
    partly filled block is never shared (grey)."""
    from matplotlib.patches import Patch, Rectangle

    labels = list(labels or [f"prompt {i + 1}" for i in range(len(sequences))])
    width = max(-(-len(s) // block_size) for s in sequences)
    ax = _axes(ax, (min(10.0, 1.3 * width + 1.5), 0.75 * len(sequences) + 1.1))
    seen: set[str] = set()
    for row, tokens in enumerate(sequences):
        keys = chained_keys(tokens, block_size)
        for b in range(-(-len(tokens) // block_size)):
            part = list(tokens[b * block_size:(b + 1) * block_size])
            if b < len(keys):
                colour, key = (CACHED if keys[b] in seen else UNCACHED), keys[b]
            else:
                colour, key = PARTIAL, "(no key)"
            ax.add_patch(Rectangle((b, row), 0.95, 0.82, facecolor=colour, edgecolor="#666666", lw=0.5))
            ax.text(b + 0.47, row + 0.25, key, ha="center", va="center", fontsize=7, family="monospace",
                    color="white" if colour != PARTIAL else "#333333")
            ax.text(b + 0.47, row + 0.58, _text(decode(part), 22), ha="center", va="center", fontsize=6,
                    color="white" if colour != PARTIAL else "#333333")
        seen.update(keys)
    ax.set(xlim=(0, width), ylim=(len(sequences), -0.1), xticks=[b + 0.47 for b in range(width)],
           xticklabels=[f"block {b}" for b in range(width)], yticks=[r + 0.41 for r in range(len(sequences))])
    ax.set_yticklabels(labels, fontsize=7)
    ax.tick_params(axis="x", labelsize=7, length=0)
    ax.xaxis.tick_top()
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"chained block keys (vLLM), blocks of {block_size} tokens", fontsize=9)
    ax.legend(handles=[Patch(color=CACHED, label="key found: from the cache"), Patch(color=UNCACHED, label="new key: computed"),
                       Patch(color=PARTIAL, label="partly filled: not shared")],
              fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=3, frameon=False)
    return ax


def radix_tree(sequences: Sequence[Sequence[int]]) -> dict:
    """The radix tree of ``sequences``: a dict from each edge's first token to ``(edge, subtree)``,
    ``edge`` the tuple of tokens the edge holds and ``subtree`` a dict of the same form (``{}`` at a
    leaf). An edge ends where the sequences below it part, or where one of them ends."""
    groups: dict[int, list[tuple[int, ...]]] = {}
    for s in sequences:
        if len(s):
            groups.setdefault(s[0], []).append(tuple(s))
    tree = {}
    for first, group in groups.items():
        shortest = min(len(s) for s in group)
        end = 1
        while end < shortest and all(s[end] == group[0][end] for s in group):
            end += 1
        tree[first] = (group[0][:end], radix_tree([s[end:] for s in group]))
    return tree


def _leaves(tree: dict) -> int:
    return sum(max(1, _leaves(sub)) for _, sub in tree.values())


def plot_radix_tree(sequences: Sequence[Sequence[int]], decode: Callable[[list[int]], str], ax=None):
    """The radix tree of ``sequences`` (SGLang's RadixAttention keeps one over the cached tokens):
    each node is an edge's run of tokens, with its text and its length; a request walks down as far
    as its tokens match, so prompts share to the token, not to the block."""
    tree = radix_tree(sequences)
    leaves = max(1, _leaves(tree))

    def depth(t: dict) -> int:
        return max((1 + depth(sub) for _, sub in t.values()), default=0)

    levels = depth(tree)
    ax = _axes(ax, (min(10.0, 2.2 * levels + 1.2), 0.7 * leaves + 1.0))
    box = dict(boxstyle="round,pad=0.3", facecolor="#f0f0f0", edgecolor="#888888", lw=0.6)

    def draw(t: dict, level: int, top: float, parent: tuple[float, float] | None) -> None:
        for edge, sub in sorted(t.values(), key=lambda e: e[0]):
            span = max(1, _leaves(sub))
            y = top + span / 2
            x = level + 0.5
            if parent is not None:
                ax.annotate("", xy=(x - 0.42, y), xytext=(parent[0] + 0.42, parent[1]),
                            arrowprops=dict(arrowstyle="-", color="#888888", lw=0.8))
            ax.text(x, y, f"{_text(decode(list(edge)), 24)}\n({len(edge)} tokens)", ha="center", va="center",
                    fontsize=6.5, bbox=box)
            draw(sub, level + 1, top, (x, y))
            top += span

    ax.text(-0.05, leaves / 2, "root", ha="right", va="center", fontsize=7)
    draw(tree, 0, 0.0, None)
    ax.set(xlim=(-0.4, levels), ylim=(leaves, 0))
    ax.axis("off")
    ax.set_title("a radix tree (SGLang): edges hold runs of tokens", fontsize=9)
    return ax
