"""Run by test_colab_widgets.py in a Python whose ipywidgets is Colab's 7.7.1: every widget of the
chapter is built, its state serialised as a notebook stores it, and each control moved to check
that the view it shows follows. Prints one JSON line per widget; exits non-zero on the first
failure. (A script, not a test module: pytest would import the book's ipywidgets 8 first.)"""
from __future__ import annotations

import json
import sys

import ipywidgets as widgets
import torch

import kvlib
from kvlib.generate import StepRecord
from kvlib.measure.experiments import BatchPoint
from kvlib.serve import Request, serve
from kvlib.widgets import context_cost_widget, memory_calculator_widget, total_arithmetic_widget
from kvlib.widgets.batching import batch_size_widget, timeline_widget
from kvlib.widgets.html import has_stack, stack
from kvlib.widgets.levers import assumptions_widget, levers_widget
from kvlib.widgets.quant import quant_grid_widget
from kvlib.widgets.reuse import TurnBlocks, conversation_blocks_widget
from kvlib.widgets.speculative import draft_steps_widget


def built() -> dict:
    torch.manual_seed(0)
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    reqs = [Request([1, 2, 3], 2), Request([4, 5], 5), Request([6], 1)]
    runs = {p: serve(model, reqs, max_batch=2, policy=p) for p in ("static", "continuous")}
    records = [StepRecord(0, 5, 5, 0.1), StepRecord(1, 6, 1, 0.1),
               StepRecord(2, 7, 4, 0.1, drafted=3, accepted=2, draft=(11, 12, 19))]
    return {
        "context_cost": context_cost_widget(kvlib.Config.tiny(), [4, 8]),
        "total_arithmetic": total_arithmetic_widget(kvlib.Config.smollm2_135m(), shapes="SmolLM2-135M shapes"),
        "memory_calculator": memory_calculator_widget(),
        "batch_size": batch_size_widget([BatchPoint(b, 0.05 + 0.002 * b, 0.001 * b + 0.02) for b in (1, 2, 4)]),
        "timeline": timeline_widget(runs),
        "quant_grid": quant_grid_widget(torch.randn(8, 64), "w", bits=(2, 4), groups=(32, None)),
        "conversation_blocks": conversation_blocks_widget([TurnBlocks((0, 1), 0, 20, 9, 16),
                                                           TurnBlocks((0, 1, 2), 16, 30, 12, 16)]),
        "draft_steps": draft_steps_widget(records, [10, 20, 11, 12, 13], lambda ids: " ".join(map(str, ids))),
        "levers": levers_widget(),
        "assumptions": assumptions_widget(),
    }


Stack7 = type(stack([widgets.HTML("a view")]))             # made on first use, under ipywidgets 7


def stacks(w) -> list:
    """Every Stack7 in the tree under ``w`` (all views, shown or not)."""
    found, todo = [], [w]
    while todo:
        node = todo.pop()
        if isinstance(node, Stack7):
            found.append(node)
            todo.extend(node.views)
        else:
            todo.extend(getattr(node, "children", ()))
    return found


def main() -> int:
    assert widgets.__version__ == "7.7.1" and not has_stack(), widgets.__version__
    for name, box in built().items():
        state = json.dumps(widgets.Widget.get_manager_state(drop_defaults=True))   # what a notebook stores
        found = stacks(box)
        assert found, f"{name}: no Stack7 under ipywidgets 7"
        moved = 0
        for link in box.links:
            (control, trait), (target, _) = link.source, link.target
            if isinstance(target, Stack7) and len(target.views) > 1:
                other = 1 if getattr(control, trait) == 0 else 0
                setattr(control, trait, other)              # a reader moves the control ...
                assert target.selected_index == other and target.children == (target.views[other],), \
                    f"{name}: the view did not follow its control"   # ... and the view follows
                moved += 1
        assert moved, f"{name}: no control moved a view"
        print(json.dumps({"widget": name, "stacks": len(found), "controls_moved": moved, "state_bytes": len(state)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
