"""The exercises of the book, read from the notebooks' ``{exercise}`` directives and tagged cells."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .base import FENCE, ROOT, cell_tags
from .names import defined_functions
from .toc import notebooks_in_order

# The line every exercise opens with: "*Kind: experiment · difficulty ★★☆*".
KIND_LINE = re.compile(r"^\*Kind: (?P<activity>experiment|derivation|implementation) · "
                       r"difficulty (?P<stars>★{1,3}☆{0,2})\*$")
ACTIVITIES = ("experiment", "derivation", "implementation")
HINT = re.compile(r"^\s*(`{3,}|:{3,})\{admonition\}\s+Hint\s+\d+\s*$", re.M)


@dataclass
class Exercise:
    section: int
    number: int                 # 1, 2, … within the section
    label: str
    title: str
    kind: str                   # "code" (has a check cell) or "question"
    notebook: str
    functions: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    stubs: list[str] = field(default_factory=list)
    has_solution: bool = False
    activity: str = ""          # the kind line's kind: "experiment", "derivation" or "implementation"
    difficulty: int = 0         # the kind line's stars, 1 to 3 (0: no kind line)
    hints: int = 0              # "Hint N" dropdowns between the statement and the solution

    @property
    def name(self) -> str:
        return f"Exercise {self.section}.{self.number}"


def exercise_heads(source: str):
    """``(label, title)`` of every ``{exercise}`` directive in a markdown cell."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if m and m.group("name") == "exercise":
            label = ""
            for opt in lines[i + 1:]:
                o = re.match(r"^\s*:label:\s*(\S+)", opt)
                if o:
                    label = o.group(1)
                if not opt.strip().startswith(":"):
                    break
            yield label, m.group("rest").strip()


def kind_line(source: str, label: str) -> tuple[str, int]:
    """``(activity, stars)`` from the kind line of the exercise ``label`` in ``source``
    (the first non-option line of its directive), or ``("", 0)``."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^\s*:label:\s*{re.escape(label)}\s*$", line):
            for rest in lines[i + 1:]:
                if rest.strip() and not rest.strip().startswith(":"):
                    m = KIND_LINE.match(rest.strip())
                    if m and len(m.group("stars")) == 3:
                        return m.group("activity"), m.group("stars").count("★")
                    return "", 0
    return "", 0


def solution_labels(source: str) -> list[str]:
    """The labels of the ``{solution}`` and ``{solution-start}`` directives in a markdown cell."""
    return [m.group("rest").strip() for m in map(FENCE.match, source.splitlines())
            if m and m.group("name") in ("solution", "solution-start")]


def _markdown(cell, section: int, path: Path, found: list[Exercise], current: Exercise | None):
    """Read a markdown cell: the exercises it opens, hints, solutions. Returns the current exercise."""
    for label, title in exercise_heads(cell.source):
        number = sum(e.notebook == path.name for e in found) + 1
        current = Exercise(section, number, label, title, "question", path.name)
        current.activity, current.difficulty = kind_line(cell.source, label)
        found.append(current)
    if current is not None and not current.has_solution:
        current.hints += len(HINT.findall(cell.source))
    for label in solution_labels(cell.source):
        for e in found:
            if e.label == label:
                e.has_solution = True
    return current


def _code(cell, current: Exercise) -> None:
    tags = cell_tags(cell)
    if "solution" in tags:
        current.functions += defined_functions(cell.source)
        current.stubs.append(cell.metadata.get("stub", ""))
    if "check" in tags:
        current.kind = "code"
        current.checks.append(cell.source)


def book_exercises(root: Path = ROOT, orphans: list[str] | None = None) -> list[Exercise]:
    """Every exercise of the book's notebooks, in order.

    A solution or check cell before the first exercise of its notebook is added to ``orphans``.
    """
    found: list[Exercise] = []
    for section, path in notebooks_in_order(root):
        nb = nbformat.read(path, as_version=4)
        current: Exercise | None = None
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                current = _markdown(cell, section, path, found, current)
            elif cell.cell_type != "code":
                continue
            elif current is not None:
                _code(cell, current)
            elif {"solution", "check"} & set(cell_tags(cell)) and orphans is not None:
                orphans.append(f"{path.name}: a cell tagged {sorted({'solution', 'check'} & set(cell_tags(cell)))} "
                               f"comes before any {{exercise}}")
    return found
