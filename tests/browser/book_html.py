"""What the browser tests expect, read from the built HTML book (no browser needed).

- :func:`book_pages`: every page of the book, relative to the HTML root;
- :func:`widget_state`: the widget state that myst-nb embeds in a page;
- :func:`slider_cases`: every slider that a widget links to the ``selected_index`` of a
  ``Stack`` (``widgets.jslink``), with what the Stack must show at each position.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML_ROOT = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html")).resolve()
CONFIG = ROOT / "_config.yml"
SCREENSHOTS = Path(os.environ.get("BOOK_SCREENSHOTS", ROOT / "_build" / "screenshots"))

STATE_MIME = "application/vnd.jupyter.widget-state+json"
VIEW_MIME = "application/vnd.jupyter.widget-view+json"
SLIDER_MODELS = {"IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "SelectionSliderModel"}
# Text widgets whose shown text is exactly their value (HTMLMath is typeset: not compared).
TEXT_MODELS = {"HTMLModel"}
LINK_MODELS = {"LinkModel", "DirectionalLinkModel"}
# Folders of the build that hold no pages of the book (theme templates, copied sources).
NOT_PAGES = ("_static/", "_sources/", "_images/", "_downloads/")


def book_pages(root: Path = HTML_ROOT) -> list[str]:
    """Every .html page of the build, as a path relative to ``root``."""
    if not root.is_dir():
        return []
    pages = (p.relative_to(root).as_posix() for p in root.rglob("*.html"))
    return sorted(p for p in pages if not p.startswith(NOT_PAGES))


def read_page(page: str, root: Path = HTML_ROOT) -> str:
    return (root / page).read_text(encoding="utf-8")


def _scripts(text: str, mime: str) -> list[str]:
    pattern = r'<script type="%s">(.*?)</script>' % re.escape(mime)
    return re.findall(pattern, text, flags=re.S)


def widget_state(text: str) -> dict[str, dict]:
    """The models of the widget state embedded in a page (model id -> model), {} if none."""
    state: dict[str, dict] = {}
    for body in _scripts(text, STATE_MIME):
        state.update(json.loads(body)["state"])
    return state


def widget_views(text: str) -> list[str]:
    """The model ids of the widget views in a page, in document order."""
    return [json.loads(body)["model_id"] for body in _scripts(text, VIEW_MIME)]


def _ref(value) -> str | None:
    if isinstance(value, str) and value.startswith("IPY_MODEL_"):
        return value[len("IPY_MODEL_"):]
    return None


def _children(model: dict) -> list[str]:
    return [c for c in (_ref(v) for v in model["state"].get("children", [])) if c]


def _walk(state: dict, model_id: str, seen: set | None = None):
    """Model ids of the subtree under ``model_id``, depth first, in display order."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in state:
        return
    seen.add(model_id)
    yield model_id
    for child in _children(state[model_id]):
        yield from _walk(state, child, seen)


def texts(state: dict, model_id: str) -> list[str]:
    """The HTML values of the HTML widgets under a model."""
    return [state[m]["state"].get("value", "") for m in _walk(state, model_id)
            if state[m]["model_name"] in TEXT_MODELS]


def rendered_texts(state: dict, model_id: str) -> list[str]:
    """The HTML values of the HTML widgets that the view of a model shows at first: like
    :func:`texts`, but a Stack shows only its selected child."""
    found: list[str] = []
    seen: set[str] = set()

    def visit(mid: str) -> None:
        if mid in seen or mid not in state:
            return
        seen.add(mid)
        model = state[mid]
        if model["model_name"] in TEXT_MODELS:
            found.append(model["state"].get("value", ""))
        children = _children(model)
        if model["model_name"] == "StackModel":
            index = model["state"].get("selected_index")
            children = [children[index]] if index is not None and 0 <= index < len(children) else []
        for child in children:
            visit(child)

    visit(model_id)
    return found


@dataclass
class SliderCase:
    """One slider linked to a Stack, and what the Stack shows at each slider position."""

    page: str
    view_index: int            # which widget view of the page (document order) holds it
    slider_index: int          # which slider of that view (document order)
    slider_id: str
    stack_id: str
    description: str
    labels: list[str]          # what the slider's readout shows at each position
    initial: int               # position at page load
    shown: list[list[str]] = field(repr=False)  # HTML values the Stack shows at each position

    @property
    def positions(self) -> int:
        return len(self.labels)

    @property
    def id(self) -> str:
        return f"{self.page}::view{self.view_index}::{self.description or 'slider'}"


def _positions(slider: dict) -> tuple[list[str], int, str]:
    """Readout labels, initial position, and the attribute whose value is the position."""
    s = slider["state"]
    if slider["model_name"] == "SelectionSliderModel":
        return list(s["_options_labels"]), int(s["index"]), "index"
    if slider["model_name"] == "IntSliderModel":
        values = list(range(s["min"], s["max"] + 1, s.get("step", 1) or 1))
        return [str(v) for v in values], values.index(s["value"]), "value"
    raise NotImplementedError(f"no position mapping for a {slider['model_name']}")


def slider_cases(page: str, text: str | None = None) -> list[SliderCase]:
    """Every slider of ``page`` that drives a Stack through a link (jslink/jsdlink)."""
    text = read_page(page) if text is None else text
    state = widget_state(text)
    views = widget_views(text)
    cases = []
    for link in (m for m in state.values() if m["model_name"] in LINK_MODELS):
        ends = [(_ref(link["state"][end][0]), link["state"][end][1]) for end in ("source", "target")]
        if link["model_name"] == "DirectionalLinkModel":
            pairs = [(ends[0], ends[1])]                    # source drives target only
        else:
            pairs = [(ends[0], ends[1]), (ends[1], ends[0])]
        for (slider_id, attr), (stack_id, stack_attr) in pairs:
            slider, stack = state.get(slider_id), state.get(stack_id)
            if not slider or not stack or slider["model_name"] not in SLIDER_MODELS:
                continue
            if stack["model_name"] != "StackModel" or stack_attr != "selected_index":
                continue
            labels, initial, position_attr = _positions(slider)
            if attr != position_attr:
                continue
            children = _children(stack)
            if slider["model_name"] == "IntSliderModel":
                order = [int(label) for label in labels]    # the value is the Stack's index
            else:
                order = list(range(len(labels)))
            shown = [rendered_texts(state, children[i]) if 0 <= i < len(children) else [] for i in order]
            for view_index, view_id in enumerate(views):
                sliders = [m for m in _walk(state, view_id) if state[m]["model_name"] in SLIDER_MODELS]
                if slider_id in sliders:
                    cases.append(SliderCase(
                        page=page, view_index=view_index, slider_index=sliders.index(slider_id),
                        slider_id=slider_id, stack_id=stack_id,
                        description=slider["state"].get("description", ""),
                        labels=labels, initial=initial, shown=shown))
                    break
    return sorted(cases, key=lambda c: (c.view_index, c.slider_index))


def repository() -> dict:
    """The ``repository`` section of _config.yml: the one place that says where the book lives."""
    return yaml.safe_load(CONFIG.read_text())["repository"]


def binder_urlpath() -> str:
    """Where the Binder button opens a notebook: JupyterLab (``lab/tree``) or the classic tree,
    as ``launch_buttons.notebook_interface`` in _config.yml says."""
    interface = yaml.safe_load(CONFIG.read_text())["launch_buttons"].get("notebook_interface", "classic")
    return "lab/tree" if interface == "jupyterlab" else "tree"


def screenshot_name(page: str, suffix: str = "") -> str:
    """chapters/04_x.html -> chapters__04_x<suffix>.png"""
    return f"{page[:-len('.html')].replace('/', '__')}{suffix}.png"
