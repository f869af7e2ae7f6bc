"""The picture of a decode step split over several devices: tensor parallelism beside pipeline
parallelism (what each device does, and when something crosses the link)."""
from __future__ import annotations

from typing import Sequence

from ..measure.scale_out import Segment

COLOURS = {"attention": "tab:blue", "MLP": "tab:green", "all-reduce": "tab:red", "stage": "tab:purple",
           "send": "tab:orange"}


def plot_timeline(segments: Sequence[Segment], ax=None, *, title: str = "", device: str = "GPU"):
    """One row per device, one bar per :class:`~kvlib.measure.scale_out.Segment`, coloured by its
    kind, in microseconds or milliseconds (whichever suits the span); a pipeline stage's bar names
    its batch. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.6), layout="constrained")
    end = max(s.start + s.seconds for s in segments)
    scale, unit = (1e6, "µs") if end < 1e-3 else (1e3, "ms")
    devices = sorted({s.device for s in segments})
    for s in segments:
        ax.barh(s.device, s.seconds * scale, left=s.start * scale, height=0.6, color=COLOURS[s.kind],
                edgecolor="white", linewidth=0.5)
        if s.kind == "stage":
            ax.text((s.start + s.seconds / 2) * scale, s.device, s.label, ha="center", va="center",
                    color="white", fontsize=8)
    kinds = [k for k in COLOURS if any(s.kind == k for s in segments)]
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds], labels=kinds,
              loc="lower right", bbox_to_anchor=(1, 1), fontsize=8, ncols=len(kinds), frameon=False)
    ax.set_yticks(devices, [f"{device} {d}" for d in devices])
    ax.set_ylim(max(devices) + 0.6, -0.6)
    ax.set_xlabel(f"time within the step ({unit})")
    ax.set_title(title, fontsize=10, loc="left")
    return ax
