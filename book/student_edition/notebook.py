"""One notebook: its student version.

- a code cell tagged ``solution`` becomes its stub (``cell.metadata["stub"]``; a solution cell
  without one is an error), outputs cleared;
- a ``{solution-start}`` … ``{solution-end}`` block and every ``{solution}`` directive are removed
  (:mod:`.markdown`);
- a cell tagged ``check`` keeps its code, loses its outputs and is tagged ``raises-exception``;
- every cell that raises with the stubs in place by the transitive name flow (:mod:`.flow`) is
  tagged ``raises-exception``: a stub that raises at its top level or uses a tainted name, and
  a later cell that uses a name only a stub, a solution or a raising cell bound (it also loses
  its outputs). Every other cell keeps its stored outputs, so nbval still compares them.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from .base import RAISES, StudentEditionError, cell_tags, set_tags
from .flow import CHECK_RAISES, TOP_RAISES, FlowCell, trace
from .markdown import split_markdown
from .names import stub_raises


def cleared(cell, extra_tags: list[str] = (), drop_tags: tuple[str, ...] = ()) -> None:
    """Remove the cell's outputs and execution count, and adjust its tags."""
    cell.outputs = []
    cell.execution_count = None
    set_tags(cell, [t for t in cell_tags(cell) if t not in drop_tags] + list(extra_tags))


@dataclass
class NotebookReport:
    """What :func:`student_notebook` did, for the tests and the log."""

    stubs: int = 0
    checks: int = 0
    dependent: list[int] = field(default_factory=list)    # indices (in the student notebook) of cleared cells
    removed_markdown: int = 0
    solution_code: list[str] = field(default_factory=list)
    solution_text: list[str] = field(default_factory=list)
    stub_code: list[str] = field(default_factory=list)


def _solution_cell(cell, index: int, here: str, report: NotebookReport) -> FlowCell:
    """Turn the solution ``cell`` into its stub (in place)."""
    stub = cell.metadata.get("stub")
    if not isinstance(stub, str) or not stub.strip():
        raise StudentEditionError(f"{here}: a cell tagged 'solution' has no student stub in its "
                                  f"metadata ('stub'); add one (see AUTHORING.md)")
    report.solution_code.append(cell.source)
    report.stub_code.append(stub)
    flow = FlowCell(index, stub, TOP_RAISES if stub_raises(stub) else "", kind="stub", shadow=cell.source)
    cell.source = stub
    del cell.metadata["stub"]
    cleared(cell, drop_tags=("solution",))
    report.stubs += 1
    return flow


def _code_cell(cell, index: int, here: str, in_block: bool, report: NotebookReport) -> FlowCell:
    """A code cell, as the student edition has it (``cell`` is changed in place)."""
    if "solution" in cell_tags(cell):
        return _solution_cell(cell, index, here, report)
    if in_block:
        raise StudentEditionError(f"{here}: a code cell inside a solution block is not tagged 'solution', "
                                  f"so its code would reach the student edition; tag it and give it a stub")
    cell.metadata.pop("stub", None)
    if "check" in cell_tags(cell):
        cleared(cell, [RAISES])
        report.checks += 1
        return FlowCell(index, cell.source, CHECK_RAISES, tagged=True, kind="check")
    return FlowCell(index, cell.source, tagged=RAISES in cell_tags(cell))


def _student_cells(nb, where: str, report: NotebookReport) -> tuple[list, list[FlowCell]]:
    """The student edition's cells of ``nb`` (changed in place), and its code cells for the flow."""
    cells, code = [], []
    in_block = False
    for index, cell in enumerate(nb.cells):
        here = f"{where}, cell {index}"
        if cell.cell_type == "markdown":
            split = split_markdown(cell.source, in_block, here)
            in_block = split.in_block
            report.solution_text.extend(split.solution)
            if not split.kept.strip():
                report.removed_markdown += 1
                continue
            if split.kept != cell.source.strip("\n"):
                cell.source = split.kept
        elif cell.cell_type == "code":
            code.append(_code_cell(cell, len(cells), here, in_block, report))
        elif in_block:
            raise StudentEditionError(f"{here}: a {cell.cell_type} cell inside a solution block")
        cells.append(cell)
    if in_block:
        raise StudentEditionError(f"{where}: a {{solution-start}} block is never closed ({{solution-end}})")
    return cells, code


def student_notebook(nb, where: str = "notebook"):
    """The student version of notebook ``nb`` (a new object) and a :class:`NotebookReport`."""
    nb = copy.deepcopy(nb)
    report = NotebookReport()
    cells, code = _student_cells(nb, where, report)
    for flow in trace(code):
        cell = cells[flow.cell.index]
        if flow.cell.kind == "stub" and flow.raising:
            set_tags(cell, cell_tags(cell) + [RAISES])
        elif flow.cell.kind == "code" and (flow.uses or flow.unbound):
            cleared(cell, [RAISES])                 # with the stubs in place it raises
            report.dependent.append(flow.cell.index)
    nb.cells = cells
    return nb, report
