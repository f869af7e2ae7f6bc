"""The widgets of the built book, alive in Chromium without a kernel: every stored widget
view renders, and every slider that drives a Stack (kvlib.widgets: one pre-drawn view per
position, linked with jslink) shows, at each position it is moved to with the keyboard
or the mouse, exactly the view stored for that position in the page's widget state."""
from __future__ import annotations

import pytest

from book_html import (HTML_ROOT, STATE_MIME, VIEW_MIME, book_pages, read_page, rendered_texts,
                       screenshot_name, slider_cases, widget_state, widget_views)

WIDGET_PAGES = [p for p in book_pages() if STATE_MIME in read_page(p)]
SLIDER_CASES = [case for page in WIDGET_PAGES for case in slider_cases(page)]

NORMALIZE_JS = "t => t.replace(/\\s+/g, ' ').trim()"

# The text an HTML string shows, as the browser parses it (the same way it parses the
# widget's value when it renders it).
TEXT_OF_HTML_JS = f"""htmls => {{
  const norm = {NORMALIZE_JS};
  return htmls.map(h => {{ const t = document.createElement('template'); t.innerHTML = h;
                          return norm(t.content.textContent); }});
}}"""

# What one widget view shows now: the visible text of its text widgets, and each slider's
# description, readout and handle.
SHOWN_JS = f"""([viewIndex]) => {{
  const norm = {NORMALIZE_JS};
  const visible = e => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length)
                       && getComputedStyle(e).visibility !== 'hidden';
  const view = document.querySelectorAll('script[type="{VIEW_MIME}"]')[viewIndex];
  const area = view.previousElementSibling;
  return {{
    texts: Array.from(area.querySelectorAll('.widget-html-content'))
                .filter(visible).map(e => norm(e.textContent)).filter(t => t),
    sliders: Array.from(area.querySelectorAll('.widget-slider')).map(s => ({{
      description: norm(s.querySelector('.widget-label').textContent),
      readout: norm((s.querySelector('.widget-readout') || {{textContent: ''}}).textContent),
      valuenow: (s.querySelector('.noUi-handle') || {{getAttribute: () => null}}).getAttribute('aria-valuenow'),
    }})),
  }};
}}"""


def _params(items, ids=None):
    if items:
        return pytest.mark.parametrize("case" if ids else "name", items, ids=ids)
    reason = f"no widgets in the book at {HTML_ROOT}" if book_pages() else f"no built book in {HTML_ROOT}"
    return pytest.mark.parametrize("case" if ids else "name", [pytest.param(None, marks=pytest.mark.skip(reason=reason))])


def _view_area(book, index):
    return book.page.locator(f'script[type="{VIEW_MIME}"]').nth(index).locator("xpath=preceding-sibling::*[1]")


@_params(WIDGET_PAGES)
def test_every_widget_view_renders(book, name):
    text = read_page(name)
    state, views = widget_state(text), widget_views(text)
    book.open(name)
    missing = book.page.evaluate(f"""() => Array.from(document.querySelectorAll(
        'script[type="{VIEW_MIME}"]')).map((s, i) => {{
          const area = s.previousElementSibling;
          const ok = area && area.classList.contains('widget-subarea')
                     && area.querySelector('.jupyter-widgets') && area.getBoundingClientRect().height > 0;
          return ok ? null : i;
        }}).filter(i => i !== null)""")
    assert not missing, f"{name}: widget views {missing} of {len(views)} did not render"
    # Each view shows the text its stored state holds (progress bars: "768/768 [...]").
    for index, model_id in enumerate(views):
        assert model_id in state, f"{name}: view {index} has no stored state (store_widget_state)"
        expected = [t for t in book.page.evaluate(TEXT_OF_HTML_JS, rendered_texts(state, model_id)) if t]
        shown = book.page.evaluate(SHOWN_JS, [index])["texts"]
        for t in expected:
            assert t in shown, f"{name}: view {index} does not show {t[:80]!r}; it shows {shown}"
    book.screenshot(screenshot_name(name))
    book.assert_clean()


@_params(SLIDER_CASES, ids=[c.id for c in SLIDER_CASES])
def test_slider_shows_the_stored_view_of_each_position(book, case):
    book.open(case.page)
    expected = [book.page.evaluate(TEXT_OF_HTML_JS, texts) for texts in case.shown]
    n = case.positions
    assert n >= 2, f"{case.id}: a slider with {n} position(s)"
    distinct = len({tuple(e) for e in expected}) == n

    def positions_shown():
        now = book.page.evaluate(SHOWN_JS, [case.view_index])
        slider = now["sliders"][case.slider_index]
        shown = [p for p in range(n) if expected[p] and all(t in now["texts"] for t in expected[p])]
        return shown, slider, now["texts"]

    def assert_at(k, how):
        deadline = 5.0
        while True:   # the view changes in the browser's next frames: poll for it
            shown, slider, texts = positions_shown()
            ok = slider["readout"] == case.labels[k] and (shown == [k] if distinct else k in shown)
            if ok or deadline <= 0:
                break
            book.page.wait_for_timeout(100)
            deadline -= 0.1
        assert slider["readout"] == case.labels[k], (
            f"{case.id}: after {how}, the slider reads {slider['readout']!r}, expected {case.labels[k]!r}")
        assert shown == [k] if distinct else k in shown, (
            f"{case.id}: after {how} (position {k}, {case.labels[k]}), the Stack shows the stored "
            f"view of position(s) {shown}; visible text: {[t[:60] for t in texts]}")

    area = _view_area(book, case.view_index)
    slider = area.locator(".widget-slider").nth(case.slider_index)
    handle = slider.locator(".noUi-handle")
    assert slider.locator(".widget-label").inner_text().strip() == case.description.strip()
    assert_at(case.initial, "loading the page")

    # Keyboard: focus the handle, then Home / ArrowRight / End / ArrowLeft.
    handle.focus()
    for key, k in (("Home", 0), ("ArrowRight", 1), ("End", n - 1), ("ArrowLeft", n - 2), ("End", n - 1)):
        before = positions_shown()[0]
        handle.press(key)
        assert_at(k, f"pressing {key}")
        if distinct and before != [k]:
            assert positions_shown()[0] != before, f"{case.id}: {key} did not change the view"

    # Mouse: press on the handle, drag it to the middle position, release.
    target = (n - 1) // 2
    track = slider.locator(".noUi-base").bounding_box()
    box = handle.bounding_box()
    start_x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    end_x = track["x"] + track["width"] * target / (n - 1)
    book.page.mouse.move(start_x, y)
    book.page.mouse.down()
    book.page.mouse.move((start_x + end_x) / 2, y, steps=5)
    book.page.mouse.move(end_x, y, steps=5)
    book.page.mouse.up()
    assert_at(target, f"dragging the handle to {target}")

    # And once more, dragging to the first position.
    box = handle.bounding_box()
    book.page.mouse.move(box["x"] + box["width"] / 2, y)
    book.page.mouse.down()
    book.page.mouse.move(track["x"] - 20, y, steps=8)
    book.page.mouse.up()
    assert_at(0, "dragging the handle past the left end")

    suffix = f"--view{case.view_index}-slider{case.slider_index}"
    book.screenshot(screenshot_name(case.page, suffix), locator=area)
    book.assert_clean()


LEVERS_PAGES = [p for p in WIDGET_PAGES if "the_levers_together" in p]

# The index of the widget view that holds dropdowns (the levers widget).
DROPDOWN_VIEW_JS = f"""() => Array.from(document.querySelectorAll('script[type="{VIEW_MIME}"]'))
  .findIndex(s => s.previousElementSibling && s.previousElementSibling.querySelector('select'))"""


@_params(LEVERS_PAGES)
def test_the_levers_widget_shows_the_table_its_controls_choose(book, name):
    """Section 11 in the static page: the model and machine dropdowns, the users buttons and the
    context slider pick, with no kernel, the table kvlib computes for that scenario."""
    from kvlib.measure.levers import Scenario
    from kvlib.widgets.levers import SHARED_PREFIX, render_levers_view

    book.open(name)
    index = book.page.evaluate(DROPDOWN_VIEW_JS)
    assert index >= 0, f"{name}: no widget with dropdowns"
    area = _view_area(book, index)
    for choice in [("Llama-3-70B", "NVIDIA GeForce RTX 4090", 1), ("Llama-2-7B", "NVIDIA A100 SXM 80GB", 128)]:
        model, machine, users = choice
        # One control at a time, at a reader's pace: ipywidgets' HTML manager can log a TypeError when
        # a Stack is switched again within the frames that attach the view it just showed.
        for act in (lambda: area.locator("select").nth(0).select_option(label=model),
                    lambda: area.locator("select").nth(1).select_option(label=machine),
                    lambda: area.locator(".widget-toggle-buttons button").filter(has_text=f"{users:,}").first.click(),
                    lambda: area.locator(".noUi-handle").first.focus(),
                    lambda: area.locator(".noUi-handle").first.press("Home")):   # the first context: 2,048 tokens
            act()
            book.page.wait_for_timeout(300)
        html = render_levers_view(Scenario(model, machine, users, 2048, shared_prefix=SHARED_PREFIX))
        expected = book.page.evaluate(TEXT_OF_HTML_JS, [html])[0]
        shown = []
        for _ in range(50):                                                 # the view changes in the next frames
            shown = book.page.evaluate(SHOWN_JS, [index])["texts"]
            if expected in shown:
                break
            book.page.wait_for_timeout(100)
        assert expected in shown, f"{name}: after choosing {choice}, the widget shows {[t[:80] for t in shown]}"
    assert "no user fits" in render_levers_view(Scenario("Llama-3-70B", "NVIDIA GeForce RTX 4090", 1, 2048))
    book.assert_clean()
