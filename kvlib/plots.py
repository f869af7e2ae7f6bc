"""Figures the notebooks draw; each function takes measured data and returns a matplotlib Axes."""
from __future__ import annotations

from typing import Mapping, Sequence

from .generate import StepRecord


def _axes(ax, figsize=(7, 4)):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def plot_step_times(runs: Mapping[str, Sequence[StepRecord]], ax=None, *, skip_first: bool = True,
                    title: str = "Time of each generation step"):
    """Seconds per step against the context length, one line per run.

    ``skip_first`` leaves out step 0: with a cache it is the prefill (the whole prompt at
    once), which is a different kind of step from the one-token steps that follow.
    """
    ax = _axes(ax)
    for label, records in runs.items():
        recs = records[1:] if skip_first else records
        ax.plot([r.context_len for r in recs], [r.seconds * 1e3 for r in recs], ".", ms=3, label=label)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("time of the step (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax
