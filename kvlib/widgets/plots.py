"""Figures the notebooks draw; each function takes measured data and returns a matplotlib Axes."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..generate import StepRecord


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
    import numpy as np

    ax = _axes(ax)
    tops = []
    for label, records in runs.items():
        recs = records[1:] if skip_first else records
        x = np.array([r.context_len for r in recs])
        y = np.array([r.seconds * 1e3 for r in recs])
        dots = ax.plot(x, y, ".", ms=3, alpha=0.5)[0]
        # A running median over 15 steps shows the trend through the timer's noise.
        ax.plot(x, rolling_median(y, 15), color=dots.get_color(), lw=2, label=f"{label} (running median)")
        tops.append(np.percentile(y, 98))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("time of the step (ms)")
    # Rare outliers (another program taking the CPU) would squash the picture; clip them.
    ax.set_ylim(0, 1.3 * max(tops))
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def rolling_median(values, window: int):
    """Median of each run of ``window`` neighbouring values (shorter at the ends)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    half = window // 2
    return np.array([np.median(values[max(0, i - half):i + half + 1]) for i in range(len(values))])
