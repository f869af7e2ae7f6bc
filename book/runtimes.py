"""A Sphinx extension: each section's run time, read from its stored notebook.

``make notebooks`` executes every notebook with nbclient, which records in each code cell's
metadata when the cell started (``iopub.execute_input``) and when it finished
(``shell.execute_reply``). The sum over a notebook's cells is the time it took to run top to
bottom, on the machine that last executed it. ``make notebooks`` runs each notebook with an
empty compile cache, so a stored run is a first run: it includes torch.compile's first
compile, which a second run on the same machine finds in its cache. This extension reads
those times when the book is built and offers them to the pages as MyST substitutions:
``{{ runtime_05 }}`` is the run time of ``chapters/05_*.ipynb`` (``"2 min 31 s"``), and
``{{ compile_05 }}`` the part of it its compiling cells took. No number is typed by hand.

Listed in ``_config.yml`` under ``sphinx: local_extensions``.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def notebook_seconds(path: Path) -> float:
    """Seconds the stored run of the notebook at ``path`` took, summed over its code cells.

    Cells without a stored run (``execution_count`` null: in the student edition, the stubs)
    are left out. Raises ``ValueError`` when a cell that ran holds no timing (it was not run
    by nbclient).
    """
    return sum(seconds for _, seconds in _cell_seconds(path))


def _cell_seconds(path: Path) -> list[tuple[dict, float]]:
    """Each code cell that ran, with its stored seconds."""
    out = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "code" or cell.get("execution_count") is None:
            continue
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in timing or "shell.execute_reply" not in timing:
            raise ValueError(f"{path.name}: code cell {i} has no execution times; run `make notebooks`")
        out.append((cell, (_stamp(timing["shell.execute_reply"]) - _stamp(timing["iopub.execute_input"])).total_seconds()))
    return out


def _compiles(cell: dict) -> bool:
    source = "".join(cell["source"])
    return "compile=True" in source or "compare_compiled(" in source


def compile_seconds(path: Path) -> float:
    """Seconds the stored run spent in the notebook's cells that compile with torch.compile
    (a first compile: ``make notebooks`` starts every notebook with an empty compile cache)."""
    return sum(seconds for cell, seconds in _cell_seconds(path) if _compiles(cell))


def fmt_runtime(seconds: float) -> str:
    """``8.4 -> '8 s'``, ``151 -> '2 min 31 s'``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60} s"


MACHINE_LINE = "This page's measurements: "        # what kvlib.describe_machine() prints


def machine(path: Path) -> str | None:
    """What the stored run of the notebook at ``path`` measured on: the rest of the line its first
    measuring cell printed with ``kvlib.describe_machine()``, or ``None`` where it prints none."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            for line in "".join(output.get("text", "")).splitlines():
                if line.startswith(MACHINE_LINE):
                    return line[len(MACHINE_LINE):]
    return None


def _span(path: Path) -> tuple[datetime, datetime]:
    """When the stored run of the notebook at ``path`` started its first cell and ended its last."""
    times = [cell["metadata"]["execution"] for cell, _ in _cell_seconds(path)]
    return _stamp(times[0]["iopub.execute_input"]), _stamp(times[-1]["shell.execute_reply"])


# The sanitizer's patterns for what varies between machines (tests/nbval_sanitize.cfg): a page
# that prints one of them has measured something, and names its machine first.
_MEASURED = re.compile(r"(?<![\w.])\d+(\.\d+)?\s?(ms|µs|s|tok/s|GB/s|GFLOP/s)\b|× (faster|slower)|≈ -?\d")
RUN_GAP_SECONDS = 300          # between one notebook's last cell and the next one's first: a kernel's start


def run_problems(paths: list[Path]) -> list[str]:
    """What keeps the stored notebooks at ``paths`` from being one run on one machine, as
    ``make notebooks`` makes it (empty when they are): the notebooks executed one after the
    other in the order of their names, each starting within ``RUN_GAP_SECONDS`` of the end of
    the one before; every page that prints a machine-dependent figure names its machine with
    ``kvlib.describe_machine()`` in that cell or before it; all of them name the same machine,
    and the date they name is the day the run started."""
    problems, spans = [], [(p, *_span(p)) for p in sorted(paths)]
    for (before, _, end), (after, start, _) in zip(spans, spans[1:]):
        gap = (start - end).total_seconds()
        if not 0 <= gap <= RUN_GAP_SECONDS:
            problems.append(f"{after.name} started {gap:+.0f} s after {before.name} ended: not one run "
                            "(`make notebooks` executes them all, one after the other)")
    machines = {}
    for path in sorted(paths):
        named, first = _first_measurement(path)
        if first is not None and (named is None or named > first):
            problems.append(f"{path.name}: cell {first} prints a measured figure before the page names its "
                            "machine (print kvlib.describe_machine() in the first measuring cell)")
        if (name := machine(path)) is not None:
            machines.setdefault(_without_threads(name), []).append(path.name)
    if len(machines) > 1:
        problems.append(f"the pages name {len(machines)} machines: {machines}")
    if spans and machines:
        day = spans[0][1].date().isoformat()
        problems += [f"{names[0]} names {name.rsplit(', ', 1)[-1]}, the run started on {day}"
                     for name, names in machines.items() if not name.endswith(day)]
    return problems


def _without_threads(name: str) -> str:
    """A machine line less its thread count: the CPU, torch and the date. A page may time one
    thread on purpose (section 4), on the same machine as the others."""
    return re.sub(r", \d+ threads?,", ",", name)


def _first_measurement(path: Path) -> tuple[int | None, int | None]:
    """The index of the first code cell that prints the machine line, and of the first that
    prints a measured figure (``None`` where there is none)."""
    named = first = None
    for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        if named is None and MACHINE_LINE in text:
            named = index
        if first is None and _MEASURED.search(text.replace(MACHINE_LINE, "")):
            first = index
    return named, first


def run_summary(paths: list[Path]) -> str:
    """``"2026-12-07, 18:40 to 19:02 UTC (22 min 10 s of execution)"``: when the stored run of the
    notebooks at ``paths`` ran, and how long its cells took in all."""
    spans = [_span(p) for p in sorted(paths)]
    start, end = spans[0][0], spans[-1][1]
    total = sum(notebook_seconds(p) for p in paths)
    return f"{start:%Y-%m-%d}, {start:%H:%M} to {end:%H:%M} UTC ({fmt_runtime(total)} of execution)"


def runtimes(chapters: Path) -> dict[str, str]:
    """``{"runtime_05": "2 min 31 s", ...}`` for every ``NN_*.ipynb`` in ``chapters``, ``compile_NN``
    for those that compile, ``notebooks_machine``: the machine the stored runs name (each machine
    once, in the order of the sections, where they name several; a thread count of its own does not
    make another machine), and ``notebooks_run``: when the run was (:func:`run_summary`)."""
    found, machines = {}, []
    for path in sorted(chapters.glob("[0-9][0-9]_*.ipynb")):
        found[f"runtime_{path.name[:2]}"] = fmt_runtime(notebook_seconds(path))
        if compiles(path):
            found[f"compile_{path.name[:2]}"] = fmt_runtime(compile_seconds(path))
        if (name := machine(path)) and _without_threads(name) not in map(_without_threads, machines):
            machines.append(name)
    found["notebooks_machine"] = "; ".join(machines) or "an unnamed machine"
    found["notebooks_run"] = run_summary(sorted(chapters.glob("[0-9][0-9]_*.ipynb")))
    return found


def compiles(path: Path) -> bool:
    """Whether a code cell of the notebook at ``path`` compiles with torch.compile."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return any(_compiles(c) for c in cells if c["cell_type"] == "code")


def _weight(path: Path) -> float:
    """The stored run time (a first run, compile included); 60 s for a notebook without times."""
    try:
        return notebook_seconds(path)
    except (ValueError, KeyError):
        return 60.0


def halves(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """Split notebooks into two lists of about the same run time (longest first, each to the
    lighter list), for two runs side by side, by their stored run times (first runs, a first
    compile included). A notebook without stored times counts 60 s."""
    bins: tuple[list[Path], list[Path]] = ([], [])
    load = [0.0, 0.0]
    for path in sorted(paths, key=_weight, reverse=True):
        lighter = 0 if load[0] <= load[1] else 1
        bins[lighter].append(path)
        load[lighter] += _weight(path)
    return sorted(bins[0]), sorted(bins[1])


def _add_substitutions(app, config) -> None:
    chapters = Path(app.srcdir) / "chapters"
    config.myst_substitutions = {**(config.myst_substitutions or {}), **runtimes(chapters)}


def setup(app):
    app.connect("config-inited", _add_substitutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def longest_first(paths: list[Path]) -> list[Path]:
    """The notebooks by run time, longest first (as :func:`halves` counts it)."""
    first, second = halves(paths)
    return sorted(first + second, key=_weight, reverse=True)


if __name__ == "__main__":      # the Makefile's order: python3 book/runtimes.py --longest-first NOTEBOOK...
    import sys

    if sys.argv[1] == "--longest-first":
        print(" ".join(str(p) for p in longest_first([Path(p) for p in sys.argv[2:]])))
    else:                        # --half 1|2 NOTEBOOK...
        print(" ".join(str(p) for p in halves([Path(p) for p in sys.argv[3:]])[int(sys.argv[2]) - 1]))
