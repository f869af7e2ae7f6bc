"""``--check-flow`` (after writing the edition): does every cell of a written student edition that
is not tagged ``raises-exception`` still run with the stubs in place?

A static check, by the transitive name flow of :mod:`.flow`, on the edition alone: a check cell
raises; so does a cell with a ``raise`` at its top level (a stub) and a cell that uses a name a
raising cell bound, or a function a stub defines to raise when called (transitively); a cell
tagged ``raises-exception`` binds nothing reliably. Every untagged cell that raises so is a
problem. The other way round, a tagged cell that uses no such name and is neither a check nor
a stub may well run: a warning only (the tag keeps nbval from comparing its outputs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Union

import nbformat

from .base import RAISES, cell_tags
from .flow import CHECK_RAISES, TOP_RAISES, CellFlow, FlowCell, Taint, trace
from .names import stub_raises
from .toc import notebooks_in_order

Notebooks = Union[str, Path, nbformat.NotebookNode, Iterable]


@dataclass
class FlowReport:
    problems: list[str] = field(default_factory=list)     # untagged cells that raise with the stubs in place
    warnings: list[str] = field(default_factory=list)     # tagged cells that may not raise
    notebooks: int = 0
    cells: int = 0                                        # code cells looked at


def edition_notebooks(target: Notebooks) -> list[tuple[str, nbformat.NotebookNode]]:
    """``(name, notebook)`` of: a written edition (its ``_toc.yml``'s notebooks, or every notebook
    under it), one notebook file, a notebook object, or an iterable of these."""
    if isinstance(target, nbformat.NotebookNode):
        return [("notebook", target)]
    if isinstance(target, (str, Path)):
        path = Path(target)
        if not path.is_dir():
            return [(path.name, nbformat.read(path, as_version=4))]
        if (path / "_toc.yml").exists():
            paths = [p for _, p in notebooks_in_order(path)]
        else:
            paths = sorted(p for p in path.rglob("*.ipynb")
                           if not {"_build", ".ipynb_checkpoints"} & set(p.relative_to(path).parts))
        return [(p.relative_to(path).as_posix(), nbformat.read(p, as_version=4)) for p in paths]
    return [pair for t in target for pair in edition_notebooks(t)]


def flow_cells(nb) -> list[FlowCell]:
    """The code cells of a student edition's notebook, as the flow sees them."""
    cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell_tags(cell)
        kind = "check" if "check" in tags else "stub" if stub_raises(cell.source) else "code"
        raises = {"check": CHECK_RAISES, "stub": TOP_RAISES}.get(kind, "")
        cells.append(FlowCell(index, cell.source, raises, tagged=RAISES in tags, kind=kind))
    return cells


def _why(name: str, taint: Taint) -> str:
    if taint.how == "stub":
        return f"uses `{name}`, which cell {taint.cell} defines to raise when called (a stub)"
    if taint.how == "solution":
        return f"uses `{name}`, which only the solution of cell {taint.cell} binds so"
    if taint.rebinds:
        return (f"uses `{name}`, which cell {taint.cell} binds again and which raises with the stubs in place "
                f"(so `{name}` is not the book's)")
    return f"uses `{name}`, bound only by cell {taint.cell}, which raises with the stubs in place"


def problem(notebook: str, flow: CellFlow) -> str:
    """What is wrong with the untagged cell of ``flow``, which raises with the stubs in place."""
    head = f"{notebook} cell {flow.cell.index}"
    if flow.cell.raises:
        return f"{head} {flow.cell.raises}: tag it {RAISES}"
    if flow.uses:
        name, taint = next(iter(flow.uses.items()))
        more = [f"`{n}`" for n in list(flow.uses)[1:]]
        also = f" (it also uses {', '.join(more)}, tainted the same way)" if more else ""
        return f"{head} {_why(name, taint)}: tag it {RAISES} or stop it using `{name}`{also}"
    name = flow.unbound[0]
    return (f"{head} uses `{name}`, which no earlier cell binds (a name only a solution defined?): "
            f"tag it {RAISES} or bind `{name}` before it")


def warning(notebook: str, flow: CellFlow) -> str:
    return (f"{notebook} cell {flow.cell.index} is tagged {RAISES} but is no check or stub cell and uses no "
            f"name that a stub or a raising cell leaves unreliable: it may run (the tag then only keeps "
            f"nbval from comparing its outputs)")


def check_flow(target: Notebooks) -> FlowReport:
    """The flow problems and warnings of a written student edition (see the module's docstring)."""
    report = FlowReport()
    for name, nb in edition_notebooks(target):
        report.notebooks += 1
        for flow in trace(flow_cells(nb)):
            report.cells += 1
            cell = flow.cell
            if not cell.tagged and flow.raising:
                report.problems.append(problem(name, flow))
            elif cell.tagged and not (cell.raises or flow.uses or flow.unbound):
                report.warnings.append(warning(name, flow))
    return report


def flow_problems(target: Notebooks) -> list[str]:
    """The cells of a written student edition that are not tagged ``raises-exception`` but raise
    with the stubs in place, one line each (empty: every untagged cell runs)."""
    return check_flow(target).problems
