"""The notebooks' memory check (conftest.py): after an nbval run, the peak resident memory of the
notebook's kernel is written to _build/notebook-memory/, and with KVLIB_NOTEBOOK_MEMORY_LIMIT set
(make test-binder: Binder's 2 GB) a run past it fails, naming the notebook. Shown here on a
two-cell notebook, under a limit it passes and one it cannot meet."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "_build" / "notebook-memory"


def _notebook(folder: Path = ROOT / "_build" / "memory-probe") -> Path:
    """A two-cell notebook inside the project (so that its conftest.py applies)."""
    cell = {"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {},
            "outputs": [{"name": "stdout", "output_type": "stream", "text": ["8000000\n"]}],
            "source": ["import numpy as np\n", "print(np.ones(1_000_000).nbytes)"]}
    nb = {"cells": [cell], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                      "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kvlib_memory_probe.ipynb"
    path.write_text(json.dumps(nb))
    return path


def _nbval(path: Path, limit: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, KVLIB_NOTEBOOK_MEMORY_LIMIT=str(limit))
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(path)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.fixture
def report():
    """The probe's report, removed afterwards (make test-times lists the notebooks' own)."""
    path = REPORTS / "kvlib_memory_probe.txt"
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_notebook_within_the_limit_passes_and_its_peak_is_recorded(report):
    done = _nbval(_notebook(), 2 * 1024 ** 3)
    assert done.returncode == 0, done.stdout[-1500:]
    peak = int(report.read_text())
    assert 20 * 2 ** 20 < peak < 2 * 1024 ** 3               # a Python kernel with numpy: tens of MB


@pytest.mark.slow
def test_a_notebook_past_the_limit_fails_the_run_and_says_which(report):
    done = _nbval(_notebook(), 1024 * 1024)          # 1 MiB: no kernel fits
    assert done.returncode != 0
    assert "the kernel of kvlib_memory_probe reached" in done.stdout and "Binder's is 2" in done.stdout


@pytest.mark.slow
def test_without_a_limit_the_peak_is_recorded_and_nothing_fails(report):
    env = {k: v for k, v in os.environ.items() if k != "KVLIB_NOTEBOOK_MEMORY_LIMIT"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(_notebook())],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and int(report.read_text()) > 0
