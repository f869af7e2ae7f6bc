"""The closing page's widget: every scenario drawn in advance, in Stacks linked to the controls
in the browser (no kernel), each row linked to its section's page."""
from __future__ import annotations

import json
import re
from pathlib import Path

import ipywidgets as widgets
import pytest
from ipywidgets.widgets.widget_link import Link

from kvlib.cache.model_shapes import MODEL_SHAPES
from kvlib.measure.levers import LEVERS, Scenario, levers
from kvlib.measure.roofline import REFERENCE_ACCELERATORS
from kvlib.widgets.levers import LEVER_CONTEXTS, LEVER_USERS, levers_widget, render_levers_view

CHAPTERS = Path(__file__).resolve().parents[2] / "chapters"


@pytest.fixture(scope="module")
def box():
    return levers_widget(start=("Llama-3-8B", "NVIDIA H100 SXM", 32, 8192))


def _state_bytes(box) -> int:
    from ipywidgets.embed import dependency_state, embed_data

    return len(json.dumps(embed_data(views=[box], state=dependency_state([box]))["manager_state"]))


def _shown(box) -> str:
    """The view the nested Stacks show now (what the browser shows, following the selected indices)."""
    w = box.stack
    while isinstance(w, widgets.Stack):
        w = w.children[w.selected_index]
    return w.value


def test_every_combination_is_drawn_and_each_one_differs(box):
    n = len(MODEL_SHAPES) * len(REFERENCE_ACCELERATORS) * len(LEVER_USERS) * len(LEVER_CONTEXTS)
    assert len(box.views) == n and repr(box).endswith(f"= {n} views)")
    values = {key: v.value for key, v in box.views.items()}
    assert len(set(values.values())) == n                  # inputs that differ give views that differ
    for (model, machine, users, context), text in values.items():
        assert f"<b>{model}</b>" in text and f"<b>{machine}</b>" in text and f"{context:,} tokens" in text
        assert REFERENCE_ACCELERATORS[machine].source in text.replace("&#x27;", "'")


def test_the_controls_drive_the_stacks_through_jslinks_only(box):
    links = [w for w in box.links if isinstance(w, Link)]
    # one link per Stack: 3 contexts (outermost) -> 4 users stacks each -> 4 machines -> 5 models
    c, u, m = len(LEVER_CONTEXTS), len(LEVER_USERS), len(REFERENCE_ACCELERATORS)
    assert len(links) == len(box.links) == 1 + c + c * u + c * u * m
    sources = {id(link.source[0]) for link in links}
    assert sources == {id(box.model), id(box.machine), id(box.users), id(box.context)}
    assert all(link.source[1] == "index" and link.target[1] == "selected_index" for link in links)
    assert sum(link.source[0] is box.context for link in links) == 1          # the slider drives one Stack
    assert box.views[("Llama-3-8B", "NVIDIA H100 SXM", 32, 8192)].value == _shown(box)


def _follow_links(box) -> None:
    """What the browser does with each jslink: the Stack takes its control's index."""
    for link in box.links:
        setattr(link.target[0], link.target[1], getattr(link.source[0], link.source[1]))


def test_the_shown_view_follows_each_control():
    box = levers_widget()
    box.model.index = list(MODEL_SHAPES).index("SmolLM2-135M")
    box.machine.index = list(REFERENCE_ACCELERATORS).index("Apple M2 Max")
    box.users.index = LEVER_USERS.index(128)
    box.context.index = LEVER_CONTEXTS.index(2048)
    _follow_links(box)
    assert _shown(box) == box.views[("SmolLM2-135M", "Apple M2 Max", 128, 2048)].value


def test_each_row_links_to_its_sections_page_and_the_pages_exist():
    view = render_levers_view(Scenario("Llama-3-8B", "NVIDIA H100 SXM", 32, 8192, shared_prefix=1024))
    pages = re.findall(r'<a href="([^"]+)\.html">', view)
    assert [lever.page for lever in LEVERS] == pages[2:]                    # after the roofline's two links
    assert pages[:2] == ["04_quadratic_versus_linear", "07_batching"]
    assert all((CHAPTERS / f"{p}.ipynb").is_file() for p in pages)
    assert view.count("<tr>") == 1 + len(LEVERS) and "no user fits" not in view


def test_the_view_shows_the_numbers_of_kvlib_measure_levers():
    s = Scenario("Llama-3-8B", "NVIDIA H100 SXM", 32, 8192, shared_prefix=1024)
    a, b = levers(s)[:2]
    view = render_levers_view(s)
    assert f"<td>{a.fit}</td><td>{a.batch}</td>" in view and f"<td>{b.fit}</td><td>{b.batch}</td>" in view
    assert f"{b.step_seconds * 1e3:.1f} ms" in view
    full = render_levers_view(Scenario("Llama-3-70B", "NVIDIA GeForce RTX 4090", 8, 32768))
    assert full.count("no user fits") == len(LEVERS) and "not one user fits" in full


def test_embedded_state_stays_small(box):
    # under the bound of the memory calculator's (tests/cache/test_memory.py), the largest widget
    assert _state_bytes(box) < 1_000_000


def test_a_start_outside_the_choices_is_refused():
    with pytest.raises(ValueError, match="not one of the widget's choices"):
        levers_widget(["Llama-3-8B"], ["NVIDIA H100 SXM"], start=("Llama-3-8B", "NVIDIA H100 SXM", 3, 8192))
    with pytest.raises(ValueError, match="at least one model"):
        levers_widget([], ["NVIDIA H100 SXM"])


def test_the_assumptions_widget_holds_every_combination_computed():
    """Section 11's second widget: α, k and the shared prefix moved by the reader, every view the
    table kvlib computes for that scenario, linked to its controls."""
    from kvlib.measure.levers import Scenario
    from kvlib.widgets.levers import ALPHAS, DRAFTS, PREFIXES, assumptions_widget, render_levers_view

    box = assumptions_widget()
    assert len(box.views) == len(ALPHAS) * len(DRAFTS) * len(PREFIXES)
    for (a, d, p), view in list(box.views.items())[::7]:
        assert view.value == render_levers_view(Scenario("Llama-3-8B", "NVIDIA H100 SXM", 32, 8192, p, a, d))
    assert (box.alpha.index, box.drafts.index, box.prefix.index) == (ALPHAS.index(0.7), DRAFTS.index(4), PREFIXES.index(1024))
    with pytest.raises(ValueError, match="not one of the widget's choices"):
        assumptions_widget(start=(0.65, 4, 1024))
