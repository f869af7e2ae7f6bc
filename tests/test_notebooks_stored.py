"""nbval compares stored outputs with a fresh run, and passes vacuously on a cell that was
never run. So every committed notebook must hold the outputs of a complete run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for p in (ROOT / "chapters").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under chapters/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_was_run_in_order(path):
    cells = json.loads(path.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not unrun, f"{path.name}: code cells {unrun} have no stored output; run `make notebooks`"
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"{path.name}: cells were not run top to bottom in one session (execution counts {counts})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_stored_errors(path):
    for cell in json.loads(path.read_text())["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if "raises-exception" in tags:
            continue
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"{path.name}: stored error {out.get('ename')}"
