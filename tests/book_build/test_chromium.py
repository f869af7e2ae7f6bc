"""book/chromium.py finds the browser the browser tests drive where the system or Playwright keeps
it: $CHROMIUM, Debian's /usr/bin/chromium, chromium or Google Chrome on PATH, Playwright's
newest download, macOS's /Applications. Fake executables in a temporary folder stand in for them."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from book import chromium

ROOT = Path(__file__).resolve().parents[2]


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def nowhere(monkeypatch, tmp_path):
    """No browser anywhere: an empty PATH, no Debian package, an empty Playwright folder."""
    monkeypatch.delenv("CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / "ms-playwright"))
    monkeypatch.setattr(chromium, "SYSTEM_PATHS", (str(tmp_path / "usr-bin-chromium"),))
    monkeypatch.setattr(chromium, "MACOS_APPS", (str(tmp_path / "Applications" / "Google Chrome"),))
    return tmp_path


def test_none_found_says_where_it_looked(nowhere, capsys):
    assert chromium.find_chromium("linux") is None
    assert chromium.main() == 1
    err = capsys.readouterr().err
    assert "no Chromium found" in err and "CHROMIUM=/path/to/chromium" in err
    assert "google-chrome" in err and "playwright install chromium" in err and "ms-playwright" in err


def test_chromium_set_by_the_user_wins(nowhere, monkeypatch):
    _exe(nowhere / "bin" / "chromium")
    monkeypatch.setenv("CHROMIUM", "/opt/my/chrome")
    assert chromium.find_chromium("linux") == "/opt/my/chrome"      # the caller reports it if it is missing


def test_debians_package_comes_first(nowhere):
    _exe(nowhere / "bin" / "google-chrome")
    debian = _exe(nowhere / "usr-bin-chromium")
    assert chromium.find_chromium("linux") == str(debian)


@pytest.mark.parametrize("name", chromium.ON_PATH)
def test_a_browser_on_path(nowhere, name):
    browser = _exe(nowhere / "bin" / name)
    assert chromium.find_chromium("linux") == str(browser)


def test_a_file_that_is_not_executable_is_skipped(nowhere):
    (nowhere / "bin").mkdir()
    (nowhere / "bin" / "chromium").write_text("")
    assert chromium.find_chromium("linux") is None


def test_playwrights_newest_download(nowhere):
    folder = nowhere / "ms-playwright"
    _exe(folder / "chromium-1097" / "chrome-linux" / "chrome")
    newest = _exe(folder / "chromium-1200" / "chrome-linux64" / "chrome")
    _exe(folder / "chromium_headless_shell-1300" / "chrome-linux" / "headless_shell")
    assert chromium.find_chromium("linux") == str(newest)


def test_playwrights_folder_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("PLAYWRIGHT_BROWSERS_PATH", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert chromium.playwright_folder("linux") == tmp_path / ".cache" / "ms-playwright"
    assert chromium.playwright_folder("darwin") == tmp_path / "Library" / "Caches" / "ms-playwright"


def test_on_macos_chrome_in_applications(nowhere):
    app = _exe(nowhere / "Applications" / "Google Chrome")
    assert chromium.find_chromium("linux") is None                  # only looked for on macOS
    assert chromium.find_chromium("darwin") == str(app)


def test_the_makefile_and_the_browser_tests_ask_this_module():
    makefile = (ROOT / "Makefile").read_text()
    assert "CHROMIUM := $(shell $(PYTHON) book/chromium.py 2>/dev/null)" in makefile
    assert "ifeq ($(origin CHROMIUM),undefined)" in makefile
    conftest = (ROOT / "tests" / "browser" / "conftest.py").read_text()
    assert "CHROMIUM = find_chromium()" in conftest
    assert os.access(ROOT / "book" / "chromium.py", os.R_OK)
