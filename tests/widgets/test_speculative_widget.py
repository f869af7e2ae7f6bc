"""The speculative-decoding section's widget: every verify step drawn in advance, drafts marked
accepted or rejected, the model's own token after them."""
from __future__ import annotations

import pytest

from kvlib.generate import StepRecord
from kvlib.widgets.speculative import draft_steps, draft_steps_widget, render_draft_step

RECORDS = [StepRecord(0, 5, 5, 0.1), StepRecord(1, 6, 1, 0.1),
           StepRecord(2, 7, 4, 0.1, drafted=3, accepted=2, draft=(11, 12, 19))]
TOKENS = [10, 20, 11, 12, 13]                 # the prefill's token, a plain step's, then 11, 12 accepted and 13


def decode(ids):
    return " ".join(f"t{i}" for i in ids)


def test_the_steps_follow_the_tokens():
    steps = draft_steps(RECORDS)
    assert steps == [{"start": 1, "draft": [], "accepted": 0}, {"start": 2, "draft": [11, 12, 19], "accepted": 2}]
    view = render_draft_step(steps, TOKENS, decode, 1)
    assert "line-through" in view and view.count("t19") == 1 and "t13" in view


def test_the_widget_opens_at_the_first_step_that_drafted():
    box = draft_steps_widget(RECORDS, TOKENS, decode)
    assert len(box.stack.children) == 2 and box.stack.selected_index == 1 and len(box.links) == 2
    with pytest.raises(ValueError, match="no verify steps"):
        draft_steps_widget(RECORDS[:1], TOKENS[:1], decode)
