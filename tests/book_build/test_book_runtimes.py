"""book/runtimes.py: the landing page's run time per section comes from the stored notebooks."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book"))
import runtimes  # noqa: E402  (book/ is a folder of Sphinx extensions, not a package)


def _notebook(tmp_path: Path, cells: list[dict]) -> Path:
    path = tmp_path / "07_x.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def _code(start: str, end: str | None, count: int | None = 1) -> dict:
    timing = {"iopub.execute_input": start} | ({"shell.execute_reply": end} if end else {})
    return {"cell_type": "code", "source": ["x = 1"], "execution_count": count, "outputs": [],
            "metadata": {"execution": timing}}


def test_notebook_seconds_adds_up_the_cells(tmp_path):
    path = _notebook(tmp_path, [
        _code("2026-11-29T15:16:27.000000Z", "2026-11-29T15:16:31.500000Z"),
        {"cell_type": "markdown", "source": ["text"], "metadata": {}},
        _code("2026-11-29T15:16:32.000000Z", "2026-11-29T15:18:32.000000Z"),
        _code("2026-11-29T15:20:00.000000Z", None, count=None),          # a stub that never ran: left out
    ])
    assert runtimes.notebook_seconds(path) == pytest.approx(124.5)
    assert runtimes.fmt_runtime(124.5) == "2 min 4 s" and runtimes.fmt_runtime(8.4) == "8 s"


def test_a_run_cell_without_timing_is_an_error(tmp_path):
    path = _notebook(tmp_path, [_code("2026-11-29T15:16:27Z", None)])
    with pytest.raises(ValueError, match="code cell 0 has no execution times; run `make notebooks`"):
        runtimes.notebook_seconds(path)


def test_every_runtime_the_landing_page_names_is_computed():
    found = runtimes.runtimes(ROOT / "chapters")
    wanted = set(re.findall(r"\{\{\s*(runtime_\d\d)\s*\}\}", (ROOT / "chapters" / "index.md").read_text()))
    sections = {f"runtime_{p.name[:2]}" for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")}
    assert wanted == sections == {k for k in found if k.startswith("runtime_")}
    assert all(re.fullmatch(r"\d+ s|\d+ min \d+ s", v) for k, v in found.items()
               if k not in ("notebooks_machine", "notebooks_run"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d, \d\d:\d\d to \d\d:\d\d UTC \((\d+ s|\d+ min \d+ s) of execution\)",
                        found["notebooks_run"])
    assert "{{ notebooks_run }}" in (ROOT / "chapters" / "index.md").read_text()
    compiled = set(re.findall(r"\{\{\s*(compile_\d\d)\s*\}\}", (ROOT / "chapters" / "index.md").read_text()))
    assert compiled <= {k for k in found if k.startswith("compile_")}
    assert "{{ notebooks_machine }}" in (ROOT / "chapters" / "index.md").read_text()
    assert " threads, torch " in found["notebooks_machine"]           # the stored runs name their machine


def test_the_halves_split_the_notebooks_by_their_first_runs(tmp_path):
    """make test's runs side by side: two halves of about the same run time; a notebook that
    compiles is weighed by its stored run, a first run that compiled (make notebooks empties
    the compile cache), and its compiling cells' time is offered to the landing page."""
    def notebook(name, seconds, source="x = 1"):
        end = f"2026-11-29T15:{16 + (27 + seconds) // 60:02d}:{(27 + seconds) % 60:02d}.000000Z"
        cell = _code("2026-11-29T15:16:27.000000Z", end) | {"source": [source]}
        path = tmp_path / name
        path.write_text(json.dumps({"cells": [cell, _code("2026-11-29T15:20:00.000000Z", "2026-11-29T15:20:05.000000Z")],
                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        return path

    compiling = notebook("05_x.ipynb", 80, "generate(model, ids, 4, compile=True)")
    others = [notebook(f"0{i}_x.ipynb", 25) for i in (1, 2, 3)]
    first, second = runtimes.halves([compiling, *others])
    assert runtimes.compiles(compiling) and not runtimes.compiles(others[0])
    assert first == [compiling] and second == sorted(others)          # 85 s against 3 × 30 s
    assert runtimes.compile_seconds(compiling) == pytest.approx(80) and runtimes.compile_seconds(others[0]) == 0
    found = runtimes.runtimes(tmp_path)
    assert found["compile_05"] == "1 min 20 s" and "compile_01" not in found and found["runtime_05"] == "1 min 25 s"


def test_the_machine_is_read_from_the_line_a_page_printed(tmp_path):
    """The landing page names the machine of the stored runs: the line kvlib.describe_machine()
    printed in a page's first measuring cell, not a name typed by hand."""
    cell = _code("2026-11-29T15:16:27Z", "2026-11-29T15:16:28Z")
    cell["outputs"] = [{"output_type": "stream", "name": "stdout",
                        "text": ["warming up\n", "This page's measurements: Some CPU (AVX2), 2 threads, torch 2.13, 2026-12-03\n"]}]
    path = _notebook(tmp_path, [cell])
    assert runtimes.machine(path) == "Some CPU (AVX2), 2 threads, torch 2.13, 2026-12-03"
    assert runtimes.machine(_notebook(tmp_path, [_code("2026-11-29T15:16:27Z", "2026-11-29T15:16:28Z")])) is None
    import kvlib
    assert kvlib.describe_machine().startswith(runtimes.MACHINE_LINE)
