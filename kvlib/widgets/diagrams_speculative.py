"""Figures of the speculative-decoding section (section 10): a small tree of draft tokens, and
the tree attention mask that verifies all of it in one forward pass (Medusa, EAGLE, SpecInfer).

A tree is given by ``parents``: for each candidate token, the index of its parent candidate,
or ``-1`` for a candidate that follows the last written token directly. Each ``plot_*``
function takes the tree and returns a matplotlib Axes.
"""
from __future__ import annotations

from typing import Sequence

from .diagrams_reuse import token_label
from .html import CACHED

__all__ = ["tree_attention_mask", "tree_paths", "plot_token_tree", "plot_tree_mask"]


def _check(parents: Sequence[int]) -> None:
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"candidate {i}'s parent must be -1 or an earlier candidate, got {p}")


def tree_attention_mask(parents: Sequence[int]) -> list[list[bool]]:
    """``mask[i][j]``: whether candidate ``i`` attends to candidate ``j``: to itself and to its
    ancestors in the tree, never to a sibling or a cousin (besides, every candidate attends to all
    the cached tokens and to the last written one, which the mask leaves out)."""
    _check(parents)
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j != -1:
            mask[i][j] = True
            j = parents[j]
    return mask


def tree_paths(parents: Sequence[int]) -> list[list[int]]:
    """Every root-to-leaf path of the tree (the candidate continuations the verify step checks)."""
    _check(parents)
    children = {i for i in parents if i >= 0}
    paths = []
    for leaf in (i for i in range(len(parents)) if i not in children):
        path, j = [], leaf
        while j != -1:
            path.append(j)
            j = parents[j]
        paths.append(path[::-1])
    return paths


def _depths(parents: Sequence[int]) -> list[int]:
    depth = []
    for p in parents:
        depth.append(0 if p == -1 else depth[p] + 1)
    return depth


def plot_token_tree(labels: Sequence[str], parents: Sequence[int], ax=None, *, root: str = "last token"):
    """The tree of candidates: the last written token at the left, each candidate right of its
    parent, numbered as the mask's rows and columns are."""
    import matplotlib.pyplot as plt

    _check(parents)
    if len(labels) != len(parents):
        raise ValueError(f"{len(labels)} labels for {len(parents)} candidates")
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    depth = _depths(parents)
    leaves = [path[-1] for path in tree_paths(parents)]
    y = {}
    for row, leaf in enumerate(leaves):
        y[leaf] = row
    for i in sorted(range(len(parents)), key=lambda i: -depth[i]):          # a parent sits between its children
        kids = [c for c, p in enumerate(parents) if p == i]
        if kids:
            y[i] = sum(y[c] for c in kids) / len(kids)
    top = [i for i, p in enumerate(parents) if p == -1]
    root_y = sum(y[i] for i in top) / max(1, len(top))
    box = dict(boxstyle="round,pad=0.3", facecolor="#f0f0f0", edgecolor="#888888", lw=0.6)
    ax.text(0, root_y, token_label(root, 14), ha="center", va="center", fontsize=7,
            bbox=dict(box, facecolor=CACHED, edgecolor=CACHED), color="white")
    for i, p in enumerate(parents):
        px, py = (0, root_y) if p == -1 else (depth[p] + 1, y[p])
        ax.plot([px + 0.3, depth[i] + 1 - 0.3], [py, y[i]], color="#888888", lw=0.8)
        ax.text(depth[i] + 1, y[i], f"{i}: {token_label(labels[i], 12)}", ha="center", va="center", fontsize=7,
                bbox=box)
    ax.set(xlim=(-0.6, max(depth) + 1.6), ylim=(len(leaves) - 0.4, -0.6))
    ax.axis("off")
    ax.set_title("the draft tree", fontsize=9)
    return ax


def plot_tree_mask(labels: Sequence[str], parents: Sequence[int], ax=None):
    """The tree attention mask: row ``i`` is candidate ``i``'s query, column ``j`` a key; a filled
    cell lets ``i`` attend to ``j`` (itself and its ancestors). A first column stands for the
    cached tokens and the last written one, which every candidate attends to."""
    import matplotlib.pyplot as plt

    mask = tree_attention_mask(parents)
    n = len(parents)
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} candidates")
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 3.6), layout="constrained")
    names = [f"{i}: {token_label(t, 10)}" for i, t in enumerate(labels)]
    for i in range(n):
        ax.add_patch(plt.Rectangle((0, i), 0.95, 0.95, color=CACHED, alpha=0.55))
        for j in range(n):
            ax.add_patch(plt.Rectangle((j + 1, i), 0.95, 0.95, color=CACHED if mask[i][j] else "#f2f2f2"))
    ax.set(xlim=(0, n + 1), ylim=(n, 0), xticks=[j + 0.47 for j in range(n + 1)],
           yticks=[i + 0.47 for i in range(n)], xlabel="attends to (keys)", ylabel="candidate (query)")
    ax.set_xticklabels(["cache"] + [str(j) for j in range(n)], fontsize=7)
    ax.set_yticklabels(names, fontsize=7)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title("the tree attention mask", fontsize=9)
    return ax
