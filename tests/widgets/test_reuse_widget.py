"""The reuse section's widget: a conversation's block table turn by turn, every view drawn in advance."""
from __future__ import annotations

import pytest

from kvlib.widgets.reuse import TurnBlocks, conversation_blocks_widget, render_turn_blocks

TURNS = [TurnBlocks((0, 1, 2), 0, 40, 9, 16), TurnBlocks((0, 1, 2, 3, 4), 32, 60, 12, 16)]


def test_every_block_is_drawn_with_its_id_and_where_it_came_from():
    first, second = render_turn_blocks(TURNS, 0), render_turn_blocks(TURNS, 1)
    assert "Turn 1" in first and first.count("display:inline-block") == 3
    assert second.count("display:inline-block") == 5 and ">4</span>" in second
    assert TURNS[1].cached_blocks == 2 and TURNS[1].full_blocks == 4     # (60 + 12 - 1) // 16


def test_the_slider_is_linked_to_every_turn():
    box = conversation_blocks_widget(TURNS, start=1)
    assert len(box.stack.children) == 2 and box.stack.selected_index == 1 and len(box.links) == 2
    assert repr(box) == "conversation_blocks_widget(2 turns)"
    with pytest.raises(ValueError, match="no turns"):
        conversation_blocks_widget([])
