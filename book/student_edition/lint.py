"""Whether the exercises are consistent: labels, titles, kind lines, hints, stubs, checks, experiments.

Each exercise has a solution, each code exercise a check cell that calls ``check_*`` on the
solution's function, each stub names its exercise ("Exercise 3.2"), labels are numbered in
order, each section has an experiment. No kvlib needed.
"""
from __future__ import annotations

import re
from pathlib import Path

from .base import ROOT
from .exercises import Exercise, book_exercises
from .toc import notebooks_in_order


def _where(e: Exercise) -> str:
    return f"{e.notebook}, {e.name} ({e.label or 'no label'})"


def _label_problems(e: Exercise, labels: list[str]) -> list[str]:
    if not e.label:
        return [f"{_where(e)}: the {{exercise}} has no :label:"]
    if labels.count(e.label) > 1:
        return [f"{_where(e)}: the label {e.label} is used more than once"]
    if not re.fullmatch(rf"ex-[a-z0-9]+-{e.number}", e.label):
        return [f"{_where(e)}: the label should be ex-<section>-{e.number} (exercises are numbered in order)"]
    return []


def _statement_problems(e: Exercise) -> list[str]:
    problems = []
    if not e.title:
        problems.append(f"{_where(e)}: the {{exercise}} has no title")
    if not e.has_solution:
        problems.append(f"{_where(e)}: no {{solution}} or {{solution-start}} block with this label")
    if not e.activity:
        problems.append(f"{_where(e)}: the statement should open with its kind line, e.g. "
                        f"'*Kind: experiment · difficulty ★★☆*' (experiment, derivation or implementation)")
    if not 1 <= e.hints <= 3:
        problems.append(f"{_where(e)}: {e.hints} hints; give one to three ('{{admonition}} Hint 1', "
                        f"':class: dropdown') between the statement and the solution")
    return problems


def _stub_problems(e: Exercise) -> list[str]:
    problems = []
    for stub in e.stubs:
        if not stub.strip():
            problems.append(f"{_where(e)}: a solution cell has no stub")
        elif not re.search(rf"\bExercise {e.section}\.{e.number}\b", stub):
            problems.append(f"{_where(e)}: its stub should name the exercise, '{e.name}', so that the student "
                            f"knows which one is not written yet")
    return problems


def _check_problems(e: Exercise) -> list[str]:
    problems = []
    for fn in e.functions:
        if not any(re.search(rf"\bcheck_\w+\(\s*{re.escape(fn)}\s*[,)]", c) for c in e.checks):
            problems.append(f"{_where(e)}: the solution defines {fn}() but no check cell after it calls "
                            f"check_<name>({fn})")
    for c in e.checks:
        called = re.findall(r"\bcheck_\w+\(\s*(\w+)", c)
        if not called:
            problems.append(f"{_where(e)}: a check cell calls no check_<name>(<function>)")
        for fn in called:
            if fn not in e.functions:
                problems.append(f"{_where(e)}: a check cell checks {fn}, which no solution of this exercise defines")
    return problems


def consistency_problems(root: Path = ROOT) -> list[str]:
    """Everything that would make an exercise unusable: each line says what and where."""
    problems: list[str] = []
    exercises = book_exercises(root, orphans=problems)
    labels = [e.label for e in exercises]
    for e in exercises:
        problems += _label_problems(e, labels) + _statement_problems(e) + _stub_problems(e) + _check_problems(e)
    for section, path in notebooks_in_order(root):
        mine = [e for e in exercises if e.section == section]
        if mine and not any(e.activity == "experiment" for e in mine):
            problems.append(f"{path.name}: no experiment among its exercises; every section asks for at least one "
                            f"(predict, run, explain)")
    return problems


def exercise_counts(root: Path = ROOT) -> dict[int, int]:
    """The number of exercises of each section."""
    counts = {section: 0 for section, _ in notebooks_in_order(root)}
    for e in book_exercises(root):
        counts[e.section] += 1
    return counts
