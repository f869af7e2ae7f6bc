"""The Makefile: `make help` lists every documented target, every documented target exists, the
README names only targets that exist, and the parallel runs work under macOS's make 3.81 (which
has no --output-sync)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
DOCUMENTED = re.findall(r"^## ([a-z][a-z%-]*): ", MAKEFILE, flags=re.MULTILINE)
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def _rules() -> set[str]:
    return {name for line in re.findall(r"^([a-z][a-z%/ -]*):(?!=)", MAKEFILE, flags=re.MULTILINE)
            for name in line.split()}


def test_every_documented_target_exists():
    assert len(DOCUMENTED) >= 15 and "help" in DOCUMENTED and "wheel" in DOCUMENTED
    assert not set(DOCUMENTED) - _rules(), f"documented but not defined: {set(DOCUMENTED) - _rules()}"


def test_the_readme_names_only_targets_that_exist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`make ([a-z][a-z-]*)", readme))
    assert {"book", "test", "wheel", "help", "setup"} <= named
    assert not named - _rules(), f"README.md names make targets that do not exist: {named - _rules()}"


@needs_make
def test_make_help_lists_every_documented_target():
    out = subprocess.run(["make", "--no-print-directory", "-s", "help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    listed = re.findall(r"^  make (\S+) ", out, flags=re.MULTILINE)
    assert listed == DOCUMENTED
    assert "build kvlib's wheel into dist/" in out


@needs_make
@pytest.mark.parametrize("version, synced", [("4.3", True), ("4.4.1", True), ("3.81", False)])
def test_output_sync_only_where_make_has_it(tmp_path, version, synced):
    """The definition of OUTPUT_SYNC, evaluated by make as if it were that version."""
    [definition] = re.findall(r"^OUTPUT_SYNC :=.*$", MAKEFILE, flags=re.MULTILINE)
    probe = tmp_path / "Makefile"
    probe.write_text(f'{definition}\nprobe:\n\t@echo "[$(OUTPUT_SYNC)]"\n')
    out = subprocess.run(["make", "-s", "-f", str(probe), "probe", f"MAKE_VERSION={version}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert out == ("[--output-sync=target]" if synced else "[]")


def test_every_parallel_run_uses_the_conditional_flag():
    assert len(re.findall(r"-j 2 \$\(OUTPUT_SYNC\)", MAKEFILE)) == 2
    assert not re.search(r"^\t.*--output-sync", MAKEFILE, flags=re.MULTILINE)


def _make_venv(venv: Path, python: str | None) -> subprocess.CompletedProcess:
    """Run the Makefile's rule that makes ``venv`` (with PYTHON=``python`` if given)."""
    given = [f"PYTHON={python}"] if python else []
    return subprocess.run(["make", "--no-print-directory", f"VENV={venv}", *given, f"{venv}/.kvlib-venv"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@needs_make
def test_a_python_of_another_version_is_refused_with_the_line_that_installs_one(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\necho 3.9\n")                              # what `python -c 'print version'` says
    fake.chmod(0o755)
    run = _make_venv(tmp_path / ".venv", str(fake))
    assert run.returncode != 0
    assert f"found: {fake} 3.9." in run.stderr and "Install one:" in run.stderr and "3.11" in run.stderr
    assert not (tmp_path / ".venv").exists()                               # nothing half made


@needs_make
@pytest.mark.skipif(shutil.which("python3.11") is None, reason="no python3.11 on PATH")
def test_a_half_made_venv_is_removed_and_made_again(tmp_path):
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")             # a venv left without a working pip
    (venv / "bin" / "python").chmod(0o755)
    run = _make_venv(venv, shutil.which("python3.11"))
    assert run.returncode == 0, run.stderr
    assert "half made" in run.stdout and "make: Python 3.11" in run.stderr
    assert (venv / ".kvlib-venv").is_file()
    assert subprocess.run([venv / "bin" / "python", "-m", "pip", "--version"], capture_output=True).returncode == 0
    again = _make_venv(venv, shutil.which("python3.11"))                   # whole now: left alone
    assert again.returncode == 0 and "half made" not in again.stdout


def _pins(text: str) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", text, flags=re.MULTILINE)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in found}


def test_the_lock_agrees_with_the_pins_and_holds_every_package_of_the_venv():
    """requirements.lock (make lock) keeps every pin of requirements.txt at its version (torch
    aside: scripts/install_torch.py installs it), and, where .venv exists, every package in it
    at the version installed: a package that floats since the lock was written fails here."""
    lock = _pins((ROOT / "requirements.lock").read_text())
    pins = _pins((ROOT / "requirements.txt").read_text())
    assert len(lock) > 100 and "torch" not in lock
    assert {k: v for k, v in pins.items() if k != "torch" and lock.get(k) != v} == {}
    python = ROOT / ".venv" / "bin" / "python"
    if python.exists():
        freeze = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True,
                                text=True, timeout=120).stdout
        installed = {k: v for k, v in _pins(freeze).items() if k != "torch"}
        assert {k: (v, lock.get(k)) for k, v in installed.items() if lock.get(k) != v} == {}, \
            "run make lock after changing requirements.txt"


def test_the_peer_pins_what_it_installs_as_the_lock_does():
    """requirements-peer.txt pins llama-cpp-python and every dependency it brings, each at
    requirements.lock's version where the book installs it too."""
    lines = [l.split("#")[0].strip() for l in (ROOT / "requirements-peer.txt").read_text().splitlines()]
    lines = [l for l in lines if l]
    assert all("==" in l for l in lines), f"unpinned: {[l for l in lines if '==' not in l]}"
    peer, lock = _pins("\n".join(lines)), _pins((ROOT / "requirements.lock").read_text())
    assert {"llama-cpp-python", "diskcache", "numpy", "typing-extensions", "jinja2"} <= set(peer)
    assert {k: (v, lock[k]) for k, v in peer.items() if k in lock and lock[k] != v} == {}
