"""The book's offline scripts (book/assets.py) come from the npm registry through Python's own
library, checked against their pinned SHA-512: no npm, no Node.js."""
from __future__ import annotations

import base64
import hashlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book"))
import assets  # noqa: E402


def _sri(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


class FakeRegistry:
    """Serves tarballs by URL, and records what was asked."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.asked = files, []

    def __call__(self, url: str, timeout: float = 0):
        self.asked.append(url)
        return io.BytesIO(self.files[url])


@pytest.fixture
def build(tmp_path, monkeypatch):
    for name, value in {"NPM_CACHE": tmp_path / "npm", "ASSETS": tmp_path / "assets",
                        "STATIC": tmp_path / "assets" / "_static", "STAMP": tmp_path / "assets" / ".assets.json"}.items():
        monkeypatch.setattr(assets, name, value)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"a program was run: {a}"))
    monkeypatch.setenv("PATH", str(tmp_path))                          # no npm, no node
    return tmp_path


def test_the_registry_addresses_of_the_pinned_packages():
    assert assets.tarball_url("@jupyter-widgets/html-manager", "1.0.6") == \
        "https://registry.npmjs.org/@jupyter-widgets/html-manager/-/html-manager-1.0.6.tgz"
    assert assets.tarball_url("mathjax", "3.2.2") == "https://registry.npmjs.org/mathjax/-/mathjax-3.2.2.tgz"


def test_a_download_is_kept_only_when_it_matches_its_pinned_sum(build):
    data = b"a tarball"
    url = assets.tarball_url("mathjax", "3.2.2")
    registry = FakeRegistry({url: data})
    assert assets.download("mathjax", "3.2.2", _sri(data), registry).read_bytes() == data
    assets.download("mathjax", "3.2.2", _sri(data), registry)
    assert registry.asked == [url]                                       # kept: not downloaded again
    with pytest.raises(SystemExit, match="does not match the pinned integrity"):
        assets.download("requirejs", "2.3.4", _sri(b"something else"),
                        FakeRegistry({assets.tarball_url("requirejs", "2.3.4"): data}))
    assert not (build / "npm" / "requirejs-2.3.4.tgz").exists()


def test_the_offline_scripts_are_laid_out_without_npm(build):
    """The real pinned tarballs (from _build/npm/, where make book keeps them), served as the
    registry would: every file the pages load is laid out, with no program run."""
    kept = ROOT / "_build" / "npm"
    files = {}
    for name, (version, integrity) in assets.PACKAGES.items():
        tgz = kept / assets._tarball(name, version).name
        if not tgz.is_file():
            pytest.skip("the pinned tarballs are not in _build/npm/ yet (make book fetches them)")
        files[assets.tarball_url(name, version)] = tgz.read_bytes()
    assets.fetch(FakeRegistry(files))
    static = build / "assets" / "_static"
    for wanted in ("widgets/requirejs/require.js", "widgets/@jupyter-widgets/html-manager/dist/embed-amd.js",
                   "mathjax/tex-mml-chtml.js", "widgets/setup.js"):
        assert (static / wanted).is_file(), wanted
