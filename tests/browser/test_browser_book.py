"""Every page of the built book, in Chromium, offline: it loads without a failed request,
a request to another host, or an error; its buttons point where _config.yml says; its
exercise hints and solutions stay hidden until clicked, the hints before the solutions."""
from __future__ import annotations

import json
import posixpath
import re
from html.parser import HTMLParser
from urllib.parse import unquote, urljoin, urlsplit

import pytest
from playwright.sync_api import expect

from book_html import HTML_ROOT, binder_urlpath, book_pages, read_page, repository

PAGES = book_pages()
NOTEBOOK_PAGES = [p for p in PAGES if (HTML_ROOT / "_sources" / p).with_suffix(".ipynb").is_file()]
SOLUTION_PAGES = [p for p in PAGES if 'class="solution' in read_page(p)]
HINT_PAGES = [p for p in PAGES if '<p class="admonition-title">Hint 1</p>' in read_page(p)]


def _params(pages):
    return pages or [pytest.param("", marks=pytest.mark.skip(reason=f"no built book in {HTML_ROOT}"))]


def test_the_book_is_built(book_root):
    assert NOTEBOOK_PAGES, "the book has no notebook pages"


class _Resources(HTMLParser):
    """The URLs a page makes the browser fetch by itself (scripts, styles, images, ...)."""

    FETCHED_LINKS = {"stylesheet", "preload", "modulepreload", "icon", "prefetch", "manifest"}

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "audio", "video", "embed") and attrs.get("src"):
            self.urls.append(attrs["src"])
        elif tag == "link" and self.FETCHED_LINKS & set((attrs.get("rel") or "").split()):
            self.urls.append(attrs.get("href") or "")


def test_pages_name_no_resource_on_another_host(book_root):
    """The HTML names no script, style or image on another host (the browser tests see
    that too; this says which setting is at fault)."""
    found = {}
    for page in PAGES:
        parser = _Resources()
        parser.feed(read_page(page))
        remote = [u for u in parser.urls if urlsplit(u).netloc]
        if remote:
            found[page] = remote
    cdn = any(k in u for urls in found.values() for u in urls for k in ("mathjax", "require", "jupyter-widgets"))
    hint = ("\nThe widget manager and MathJax come from CDNs: the book was built with the CDN "
            "configuration (BOOK_JS=cdn; see book/assets.py). Rebuild without it (make book-static)." if cdn else "")
    assert not found, f"pages load from other hosts: {json.dumps(found, indent=1)}{hint}"


class _Anchors(HTMLParser):
    """The links and the ids of a page."""

    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if tag == "a" and attrs.get("href") is not None:
            self.hrefs.append(attrs["href"])


def test_internal_links_resolve(book_root):
    """Every link from a page to the book (another page, a section, an exercise, a
    download) names a file of the build, and an id that this file has."""
    parsed: dict[str, _Anchors] = {}

    def anchors(page: str) -> _Anchors:
        if page not in parsed:
            parsed[page] = _Anchors()
            parsed[page].feed(read_page(page))
        return parsed[page]

    broken = []
    for page in PAGES:
        for href in anchors(page).hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            path, fragment = unquote(parts.path), unquote(parts.fragment)
            if path.endswith("/"):
                path += "index.html"
            target = posixpath.normpath(posixpath.join(posixpath.dirname(page), path)) if path else page
            if not (HTML_ROOT / target).is_file():
                broken.append(f"{page}: {href} (no file {target})")
            elif fragment and target.endswith(".html") and fragment not in anchors(target).ids:
                broken.append(f"{page}: {href} (no id {fragment!r} in {target})")
    assert not broken, f"{len(broken)} broken internal links:\n  " + "\n  ".join(broken[:30])


@pytest.mark.parametrize("name", _params(PAGES))
def test_page_loads_offline_without_errors(book, name):
    book.open(name).assert_clean()
    assert book.page.title(), f"{name} has no title"


@pytest.mark.parametrize("name", _params(NOTEBOOK_PAGES))
def test_launch_and_download_buttons_follow_the_repository_setting(book, name):
    repo = repository()
    url = repo["url"].rstrip("/")
    owner_repo = url.split("github.com/", 1)[1]
    branch = repo.get("branch") or "main"
    book_path = (repo.get("path_to_book") or "").strip("/")
    notebook = "/".join(p for p in (book_path, name[:-len(".html")] + ".ipynb") if p)
    expected = {
        "Colab": f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/{notebook}",
        "Binder": f"https://mybinder.org/v2/gh/{owner_repo}/{branch}?urlpath={binder_urlpath()}/{notebook}",
        "repository": url,
    }
    book.open(name)
    hrefs = book.page.eval_on_selector_all(".bd-header-article a[href]", "els => els.map(e => e.href)")
    for what, href in expected.items():
        assert href in hrefs, f"{name}: no {what} link {href}; header links: {hrefs}"
    # "Download .ipynb": served by the book itself, and it is the notebook.
    source = "_sources/" + name[:-len(".html")] + ".ipynb"
    downloads = [h for h in hrefs if h.endswith(source)]
    assert downloads, f"{name}: no download link to {source}; header links: {hrefs}"
    target = urljoin(book.page.url, downloads[0])
    assert target.startswith(book.base_url), f"{name}: the download link leaves the book: {target}"
    response = book.page.request.get(target)
    assert response.ok, f"{name}: download link {target} -> HTTP {response.status}"
    assert json.loads(response.body())["nbformat"] == 4
    book.assert_clean()


def _hidden_until_clicked(name: str, what: str, box) -> None:
    """``box`` (a solution or a hint) is a dropdown: its title shows, its body is hidden until the
    title's toggle is clicked, then shows something, and hides again on a second click."""
    title = box.locator(":scope > .admonition-title")
    assert "dropdown" in (box.get_attribute("class") or "").split(), (
        f"{name}: {what} ({title.inner_text()!r}) is not a dropdown (:class: dropdown)")
    body = box.locator(":scope > :not(.admonition-title)")
    assert body.count() > 0, f"{name}: {what} is empty"
    expect(title).to_be_visible()
    for j in range(body.count()):
        expect(body.nth(j)).to_be_hidden()
    box.locator(".toggle-button").first.click()
    expect(body.first).to_be_visible()
    assert body.first.inner_text().strip(), f"{name}: {what} shows nothing once opened"
    box.locator(".toggle-button").first.click()
    expect(body.first).to_be_hidden()


@pytest.mark.parametrize("name", _params(SOLUTION_PAGES))
def test_exercise_solutions_are_hidden_until_clicked(book, name):
    book.open(name)
    solutions = book.page.locator("div.solution")
    count = solutions.count()
    assert count == read_page(name).count('<div class="solution'), "not every solution is on the page"
    for i in range(count):
        _hidden_until_clicked(name, f"solution {i + 1}", solutions.nth(i))
    book.assert_clean()


# The order of a page's exercises (E), their hints (H) and solutions (S), as the browser shows them.
_ORDER = """() => Array.from(document.querySelectorAll('div.exercise, div.solution, div.admonition'))
    .map(d => d.classList.contains('exercise') ? 'E' : d.classList.contains('solution') ? 'S'
         : (/^Hint \\d+/.test(d.querySelector(':scope > .admonition-title')?.textContent.trim() ?? '') ? 'H' : ''))
    .join('')"""


@pytest.mark.parametrize("name", _params(HINT_PAGES))
def test_exercise_hints_come_before_the_solutions_and_open_on_click(book, name):
    book.open(name)
    title = book.page.locator(":scope > .admonition-title", has_text=re.compile(r"^\s*Hint \d+"))
    hints = book.page.locator("div.admonition").filter(has=title)
    count = hints.count()
    assert count == read_page(name).count('<p class="admonition-title">Hint '), "not every hint is on the page"
    order = book.page.evaluate(_ORDER)
    # every exercise is its statement, then its hints, then its solution: no hint after a solution
    assert re.fullmatch(r"(EH+S)+", order), f"{name}: exercises (E), hints (H), solutions (S) in the order {order}"
    for i in range(count):
        _hidden_until_clicked(name, f"hint {i + 1}", hints.nth(i))
    book.assert_clean()


def test_only_ipywidgets_disposed_view_race_is_set_aside():
    """The one console error not counted against a page is ipywidgets' own disposed-view race,
    thrown from its html-manager; the same words from the book's code, or any other error, count."""
    from conftest import UPSTREAM_RACE, is_upstream_race

    manager = "http://127.0.0.1:1/_static/widgets/@jupyter-widgets/html-manager/dist/embed-amd.js?v=1"
    assert is_upstream_race(f"TypeError: {UPSTREAM_RACE}\n    at St.processMessage", manager)
    assert not is_upstream_race(f"TypeError: {UPSTREAM_RACE}", "http://127.0.0.1:1/_static/kvlib.js")
    assert not is_upstream_race("TypeError: Cannot read properties of null (reading 'render')", manager)
    assert not is_upstream_race("ReferenceError: require is not defined", manager)
