"""The Chromium that the browser tests (tests/browser) drive: where the system or Playwright keeps one.

    python book/chromium.py      # print the path of the first one found; exit 1, saying where it looked, if none

The order: ``$CHROMIUM`` if set; Debian's ``/usr/bin/chromium``; ``chromium``, ``chromium-browser``,
``google-chrome``, ``google-chrome-stable`` on PATH; the newest browser ``playwright install
chromium`` downloaded (``$PLAYWRIGHT_BROWSERS_PATH``, else ``~/.cache/ms-playwright`` on Linux
and ``~/Library/Caches/ms-playwright`` on macOS); on macOS, Google Chrome or Chromium in
``/Applications``. The Makefile's ``chromium`` target and tests/browser/conftest.py both ask this
module. Standard library only.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

SYSTEM_PATHS = ("/usr/bin/chromium",)
ON_PATH = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Inside one of Playwright's chromium-<revision>/ folders: the older Chromium builds, then
# Chrome for Testing (which newer Playwright releases download), Linux and macOS.
PLAYWRIGHT_EXECUTABLES = (
    "chrome-linux/chrome",
    "chrome-linux64/chrome",
    "chrome-mac/Chromium.app/Contents/MacOS/Chromium",
    "chrome-mac-arm64/Google Chrome for Testing.app/Contents/MacOS/Google Chrome for Testing",
    "chrome-mac-x64/Google Chrome for Testing.app/Contents/MacOS/Google Chrome for Testing",
)
MACOS_APPS = ("/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
              "/Applications/Chromium.app/Contents/MacOS/Chromium")


def _executable(path: str | os.PathLike) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def playwright_folder(platform: str = sys.platform) -> Path:
    """Where ``playwright install`` puts its browsers on this system."""
    if os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
        return Path(os.environ["PLAYWRIGHT_BROWSERS_PATH"]).expanduser()
    if platform == "darwin":
        return Path.home() / "Library" / "Caches" / "ms-playwright"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ms-playwright"


def candidates(platform: str = sys.platform) -> list[str]:
    """Every place looked at, in order (whether or not a browser is there)."""
    found = list(SYSTEM_PATHS)
    found += [shutil.which(name) or name for name in ON_PATH]
    revisions = sorted(playwright_folder(platform).glob("chromium-*"),
                       key=lambda p: int(re.sub(r"\D", "", p.name) or 0), reverse=True)
    found += [str(folder / exe) for folder in revisions for exe in PLAYWRIGHT_EXECUTABLES]
    if platform == "darwin":
        found += list(MACOS_APPS)
    return found


def find_chromium(platform: str = sys.platform) -> str | None:
    """The browser to drive: ``$CHROMIUM`` when set (even if it is not there: the caller says so),
    else the first of :func:`candidates` that is an executable file, else None."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return next((c for c in candidates(platform) if os.sep in c and _executable(c)), None)


def how_to_get_one() -> str:
    """What to do when no browser was found (one paragraph)."""
    return ("Install one: sudo apt-get install chromium (Debian; Ubuntu: chromium-browser or Google "
            "Chrome), or `.venv/bin/python -m playwright install chromium`, or on macOS Google Chrome; "
            "or point the tests at one you have: make test CHROMIUM=/path/to/chromium. Looked in "
            f"/usr/bin/chromium, PATH ({', '.join(ON_PATH)}), {playwright_folder()}"
            + (" and /Applications" if sys.platform == "darwin" else "") + ".")


def main() -> int:
    path = find_chromium()
    if path is None:
        print(f"error: no Chromium found for the browser tests. {how_to_get_one()}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
