"""The transitive name flow of a notebook with the stubs in place: which cells raise, and why.

Cell by cell, in order, a name is *tainted* when the cell that bound it last raises with the
stubs in place (a check cell, a stub that raises at its top level, a cell tagged
``raises-exception``: such a cell binds nothing reliably), or when it is a function that raises
whenever it is called (a stub's ``def`` whose body raises), or, where the instructor edition's
cell is known, when only the solution binds it (or binds it to another value than the stub).
A cell that uses a tainted name raises too, and taints what it binds: the flow is transitive.
The edition's writer tags with it (:mod:`.notebook`) and ``--check-flow`` checks with it
(:mod:`.flowcheck`), so that a freshly written edition passes its own check.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .names import bound_names, immediate_reads, is_builtin, raising_functions, used_names

CHECK_RAISES = "is a check cell, which raises on a stub (CheckFailed)"
TOP_RAISES = "raises by itself (a raise at its top level, as a stub's)"


@dataclass
class FlowCell:
    """One code cell of a notebook, as the flow sees it."""

    index: int                  # its index among the notebook's cells
    source: str                 # its code in the student edition
    raises: str = ""            # why it raises by itself with the stubs in place ("": it does not)
    tagged: bool = False        # tagged raises-exception: binds nothing reliably
    kind: str = "code"          # "code", "check" or "stub"
    shadow: str | None = None   # the instructor edition's code of the cell (a solution), where known


@dataclass(frozen=True)
class Taint:
    """Why a name cannot be relied on: ``cell`` made it so, ``how`` says in which way."""

    cell: int
    how: str                    # "raises" (bound by a cell that raises), "stub" (a function that
                                # raises when called) or "solution" (bound so only by the solution)
    rebinds: bool = False       # a cell that ran had bound it before


@dataclass
class CellFlow:
    cell: FlowCell
    uses: dict[str, Taint] = field(default_factory=dict)    # the tainted names it uses
    unbound: list[str] = field(default_factory=list)        # names it reads that no earlier cell binds

    @property
    def raising(self) -> bool:
        """Whether it raises (or may) with the stubs in place, so that it binds nothing reliably."""
        return bool(self.cell.raises or self.cell.tagged or self.uses or self.unbound)


@dataclass
class _State:
    tainted: dict[str, Taint] = field(default_factory=dict)
    reliable: set[str] = field(default_factory=set)         # bound last by a cell that ran
    known: set[str] = field(default_factory=set)            # bound by some earlier cell
    star: bool = False                                      # a `from ... import *` ran: anything may be bound

    def taint(self, name: str, cell: int, how: str) -> None:
        old = self.tainted.get(name)
        self.tainted[name] = Taint(cell, how, name in self.reliable or bool(old and old.rebinds))
        self.reliable.discard(name)

    def rely(self, name: str) -> None:
        self.tainted.pop(name, None)
        self.reliable.add(name)


def _bindings(source: str) -> tuple[set[str], set[str]]:
    """The names ``source`` binds, and those of them it binds only by an import."""
    every = bound_names(source)
    return every, every - bound_names(source, imports=False)


def _bind(state: _State, cell: FlowCell, raising: bool) -> None:
    """Record what ``cell`` binds, reliably or not."""
    mine, my_imports = _bindings(cell.source)
    theirs, their_imports = _bindings(cell.shadow) if cell.shadow is not None else (set(), set())

    def imported_again(name: str) -> bool:     # only imported, and already there: the same object again
        return (name in state.reliable and (name not in mine or name in my_imports)
                and (name not in theirs or name in their_imports))

    if raising:
        for name in sorted(mine | theirs):
            if not imported_again(name):
                state.taint(name, cell.index, "raises")
    else:
        stubs = raising_functions(cell.source)
        for name in sorted(mine):
            if name in stubs:
                state.taint(name, cell.index, "stub")
            elif name in theirs and not (name in my_imports and name in their_imports):
                state.taint(name, cell.index, "solution")           # the stub binds it to something else
            else:
                state.rely(name)
        for name in sorted(theirs - mine):
            if not imported_again(name):
                state.taint(name, cell.index, "solution")           # missing in the student edition
    state.known |= mine | theirs
    state.star = state.star or "*" in (mine | theirs)


def trace(cells: Iterable[FlowCell]) -> list[CellFlow]:
    """The flow through the code cells of one notebook, in order."""
    state = _State()
    flows = []
    for cell in cells:
        uses = {n: state.tainted[n] for n in sorted(used_names(cell.source)) if n in state.tainted}
        unbound = [] if state.star else sorted(n for n in immediate_reads(cell.source)
                                               if n not in state.known and not is_builtin(n))
        flow = CellFlow(cell, uses, unbound)
        _bind(state, cell, flow.raising)
        flows.append(flow)
    return flows
