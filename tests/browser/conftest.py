"""Browser tests of the built HTML book: a real Chromium, driven by Playwright, reads the
book from a local web server, with every request to another host blocked and recorded.

Run by `make test` after the book is built (`make test-browser` runs only these, after
`make book-static`). Not collected by a plain `pytest` (see `norecursedirs` in
pyproject.toml): `pytest tests/browser`. Settings, from the environment:

- BOOK_HTML: the built book (default _build/html);
- CHROMIUM: the browser; by default the first that book/chromium.py finds (Debian's
  /usr/bin/chromium; chromium, chromium-browser or google-chrome on PATH; the newest
  `playwright install chromium` download; on macOS, /Applications);
- BOOK_SCREENSHOTS: where screenshots go (default _build/screenshots).
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from book.chromium import find_chromium, how_to_get_one
from book_html import HTML_ROOT, SCREENSHOTS, book_pages

CHROMIUM = find_chromium()
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
    # Belt and braces: even a request that got past the route below could not leave.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
LOCAL_HOST = "127.0.0.1"

# Everything the route handler blocked, over the whole session (reported at the end).
OUTSIDE_REQUESTS: list[tuple[str, str]] = []
PAGES_LOADED: list[str] = []
# One console error of ipywidgets 8.1's own page code, not of the book: a Lumino message reaching a
# widget whose view was already disposed (JupyterLuminoWidget.processMessage reads `_view` after
# dispose), thrown now and then when a slider switches a Stack's views faster than anyone drags;
# the views the slider shows are checked position by position all the same. It is recorded and
# listed at the end of the run, not counted as the page's error; any other console error is.
UPSTREAM_RACE = "Cannot read properties of null (reading 'processLuminoMessage')"
UPSTREAM_ERRORS: list[tuple[str, str]] = []


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.browser)


def pytest_terminal_summary(terminalreporter):
    if not PAGES_LOADED:
        return
    terminalreporter.write_sep("-", "browser: what the book asked for")
    terminalreporter.write_line(f"page loads: {len(PAGES_LOADED)} ({len(set(PAGES_LOADED))} pages)")
    terminalreporter.write_line(f"requests to other hosts (blocked): {len(OUTSIDE_REQUESTS)}")
    for page, url in OUTSIDE_REQUESTS[:20]:
        terminalreporter.write_line(f"  {page}: {url}")
    terminalreporter.write_line(f"ipywidgets' disposed-view race in the console (not counted): {len(UPSTREAM_ERRORS)}")
    for page, text in UPSTREAM_ERRORS[:5]:
        terminalreporter.write_line(f"  {page}: {text[:120]}")
    terminalreporter.write_line(f"screenshots: {SCREENSHOTS}")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".woff2": "font/woff2", ".woff": "font/woff", ".js": "text/javascript"}

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def book_root() -> Path:
    if not book_pages(HTML_ROOT):
        pytest.fail(f"no built book in {HTML_ROOT}: build it first (`make book-static`)", pytrace=False)
    return HTML_ROOT


@pytest.fixture(scope="session")
def base_url(book_root):
    """The book, served by a Python http.server thread on 127.0.0.1."""
    handler = functools.partial(_QuietHandler, directory=str(book_root))
    server = http.server.ThreadingHTTPServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{LOCAL_HOST}:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser_context(tmp_path_factory):
    """One headless Chromium with a fresh profile (user-data dir) for the session."""
    if CHROMIUM is None or not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        where = f"at {CHROMIUM}" if CHROMIUM else "anywhere"
        pytest.fail(f"Chromium not found {where}. `make test` installs Debian's package when it can "
                    f"(as root, with apt-get). {how_to_get_one()}", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900}, service_workers="block")
        context.set_default_timeout(20_000)
        yield context
        context.close()


def is_upstream_race(text: str, url: str) -> bool:
    """Whether a console error is :data:`UPSTREAM_RACE`, thrown from ipywidgets' html-manager."""
    return text.startswith("TypeError: " + UPSTREAM_RACE) and "@jupyter-widgets/html-manager/" in url


class BookPage:
    """A browser tab on the book that records what goes wrong: requests to other hosts
    (blocked), failed requests, HTTP errors, uncaught page errors and console errors."""

    def __init__(self, page, base_url: str):
        self.page, self.base_url = page, base_url
        self.name = ""
        self.outside: list[str] = []
        self.failed: list[str] = []
        self.http_errors: list[str] = []
        self.page_errors: list[str] = []
        self.console_errors: list[str] = []
        page.route("**/*", self._route)
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        page.on("pageerror", lambda err: self.page_errors.append(f"{err.name}: {err.message}\n{err.stack}"))
        page.on("console", self._console)

    def _route(self, route):
        url = route.request.url
        if urlsplit(url).hostname == LOCAL_HOST:
            route.continue_()
        else:
            self.outside.append(url)
            OUTSIDE_REQUESTS.append((self.name, url))
            route.abort("blockedbyclient")

    def _failed(self, request):
        if urlsplit(request.url).hostname == LOCAL_HOST:
            self.failed.append(f"{request.url} ({request.failure})")

    def _response(self, response):
        if response.status >= 400:
            self.http_errors.append(f"{response.status} {response.url}")

    def _console(self, message):
        if message.type == "error" and is_upstream_race(message.text, message.location.get("url", "")):
            UPSTREAM_ERRORS.append((self.name, message.text))
        elif message.type == "error":
            self.console_errors.append(f"{message.text} (at {message.location.get('url', '?')})")

    def open(self, name: str) -> "BookPage":
        """Load a page of the book and wait until it has settled: widgets rendered,
        formulas typeset, no request in flight."""
        self.name = name
        PAGES_LOADED.append(name)
        self.page.goto(self.base_url + name, wait_until="load")
        views = self.page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
        if views:
            try:
                self.page.wait_for_function(RENDERED_JS, timeout=30_000)
            except Exception:  # the test that checks rendering says which view is missing
                pass
        self.page.wait_for_load_state("networkidle")
        self.page.evaluate(MATHJAX_DONE_JS)
        self.page.wait_for_load_state("networkidle")
        time.sleep(0.2)   # let late errors of the last tasks arrive
        return self

    def problems(self) -> list[str]:
        found = []
        for label, items in (("requests to other hosts", self.outside), ("failed requests", self.failed),
                             ("HTTP errors", self.http_errors), ("uncaught page errors", self.page_errors),
                             ("console errors", self.console_errors)):
            if items:
                found.append(f"{label} ({len(items)}):\n  " + "\n  ".join(items[:10]))
        return found

    def assert_clean(self):
        problems = self.problems()
        assert not problems, f"{self.name}:\n" + "\n".join(problems)

    def screenshot(self, name: str, locator=None, full_page: bool = True) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / name
        if locator is not None:
            locator.screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path), full_page=full_page)
        return path


# True once every widget view script has its rendered widget right before it.
RENDERED_JS = """() => Array.from(document.querySelectorAll(
    'script[type="application/vnd.jupyter.widget-view+json"]')).every(s => {
      const area = s.previousElementSibling;
      return area && area.classList.contains('widget-subarea') && area.querySelector('.jupyter-widgets');
    })"""

# Resolves once MathJax 3 (if the page loads it) has typeset the page.
MATHJAX_DONE_JS = """() => (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise)
    ? window.MathJax.startup.promise.then(() => true) : true"""


@pytest.fixture
def book(browser_context, base_url):
    page = browser_context.new_page()
    yield BookPage(page, base_url)
    page.close()


@pytest.fixture(scope="session", autouse=True)
def _fresh_screenshots():
    """Screenshots of this run only."""
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
    yield
