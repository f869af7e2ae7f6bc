#!/usr/bin/env python3
"""Write the student edition of the book: the same notebooks, without the solutions.

    python scripts/student_edition.py [--out student]      # write the edition
    python scripts/student_edition.py --check               # only the consistency check
    python scripts/student_edition.py --out student --leaks # after a build: scan it for solution text

Reads every page of ``_toc.yml`` in order and writes ``<out>/chapters/*.ipynb``:

- a code cell tagged ``solution`` becomes its stub (``cell.metadata["stub"]``; a solution
  cell without one is an error), outputs cleared; it is tagged ``raises-exception`` only if
  the stub itself raises when run (a ``def`` whose body raises does not);
- a ``{solution-start}`` … ``{solution-end}`` block (the markdown cells, or parts of cells,
  from the one to the other) and every ``{solution}`` directive are removed;
- a cell tagged ``check`` keeps its code, loses its outputs and is tagged
  ``raises-exception``: on a stub it raises ``CheckFailed``;
- a later code cell that uses a name a solution cell defined (say, it calls the student's
  function to compare it with a measurement) loses its outputs and is tagged
  ``raises-exception`` too: with the stub it raises. Every other cell keeps its stored
  outputs, so nbval still compares them.

It also copies the other pages of ``_toc.yml`` (``chapters/index.md``, …) and the other
files of ``chapters/`` (images), leaves out the pages meant for instructors, and writes
``<out>/_config.yml`` and ``<out>/_toc.yml`` so that ``jupyter-book build <out>`` builds the
edition, and a short ``<out>/README.md`` for students.

Before writing anything it checks that the exercises are consistent (no kvlib needed): each
exercise has a solution, each code exercise a check cell that calls ``check_*`` on the
solution's function, each stub names its exercise ("Exercise 3.2"), labels are numbered
in order. Any problem stops it with a message.

Only the standard library and nbformat.
"""
from __future__ import annotations

import argparse
import ast
import copy
import html
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
# Pages for instructors only: left out of the student edition and its table of contents.
INSTRUCTOR_ONLY = ("chapters/instructors",)
RAISES = "raises-exception"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}(?P<rest>.*)$")


class StudentEditionError(Exception):
    """The book cannot be turned into a student edition as it stands (the message says why)."""


# --------------------------------------------------------------------------------------------
# The table of contents
# --------------------------------------------------------------------------------------------

def toc_entries(root: Path = ROOT) -> list[str]:
    """The pages of ``_toc.yml`` in order (root first), as paths without a suffix."""
    entries = []
    for line in (root / "_toc.yml").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*(?:-\s+)?(?:root|file):\s*['\"]?([^'\"#\s]+)", line)
        if m:
            entries.append(re.sub(r"\.(ipynb|md)$", "", m.group(1)))
    return entries


def _page_file(root: Path, entry: str) -> Path:
    for suffix in (".ipynb", ".md"):
        if (root / (entry + suffix)).exists():
            return root / (entry + suffix)
    raise StudentEditionError(f"_toc.yml lists {entry!r}, but neither {entry}.ipynb nor {entry}.md exists")


def notebooks_in_order(root: Path = ROOT) -> list[tuple[int, Path]]:
    """``(section number, path)`` of every notebook of the book, in ``_toc.yml`` order.

    The root page is not numbered; the chapters after it are sections 1, 2, … in order.
    """
    out = []
    for number, entry in enumerate(toc_entries(root)):
        path = _page_file(root, entry)
        if path.suffix == ".ipynb":
            out.append((number, path))
    return out


# --------------------------------------------------------------------------------------------
# Markdown: find and remove the solution directives
# --------------------------------------------------------------------------------------------

def _closes(line: str, fence: str) -> bool:
    s = line.strip()
    return len(s) >= len(fence) and set(s) == {fence[0]}


def _directive_end(lines: list[str], start: int, fence: str) -> int:
    """Index of the line that closes the directive opened at ``lines[start]`` (or the last line)."""
    for j in range(start + 1, len(lines)):
        if _closes(lines[j], fence):
            return j
    return len(lines) - 1


@dataclass
class _MarkdownSplit:
    kept: str                  # the text a student sees
    solution: list[str]        # the solution text that was removed
    in_block: bool             # a {solution-start} block is still open at the end of the cell


def split_markdown(text: str, in_block: bool, where: str = "") -> _MarkdownSplit:
    """Remove ``{solution}`` directives and ``{solution-start}`` … ``{solution-end}`` blocks.

    ``in_block`` says whether a ``{solution-start}`` block opened in an earlier cell is still
    open; the result says whether it still is at the end of this one.
    """
    lines = text.splitlines()
    kept: list[str] = []
    solution: list[str] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        name = m.group("name") if m else None
        if in_block:
            if name == "solution-end":
                i = _directive_end(lines, i, m.group("fence")) + 1
                in_block = False
                continue
            if name in ("solution-start", "solution", "exercise", "exercise-start"):
                raise StudentEditionError(f"{where}: a {{{name}}} inside an open {{solution-start}} block "
                                          f"(a {{solution-end}} is missing)")
            solution.append(lines[i])
            i += 1
            continue
        if name == "solution-start":
            i = _directive_end(lines, i, m.group("fence")) + 1
            in_block = True
            continue
        if name == "solution":
            end = _directive_end(lines, i, m.group("fence"))
            solution.extend(lines[i + 1:end])
            i = end + 1
            continue
        if name == "solution-end":
            raise StudentEditionError(f"{where}: {{solution-end}} without a {{solution-start}} before it")
        kept.append(lines[i])
        i += 1
    return _MarkdownSplit("\n".join(kept).strip("\n"), solution, in_block)


# --------------------------------------------------------------------------------------------
# Code: which names a cell binds and uses
# --------------------------------------------------------------------------------------------

def _parse(source: str) -> ast.Module | None:
    # IPython magics and shell escapes are not Python: drop those lines before parsing
    lines = [("" if ln.lstrip().startswith(("%", "!")) else ln) for ln in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


class _TopLevelBindings(ast.NodeVisitor):
    """Names a cell binds in the notebook's namespace (not the locals of its functions)."""

    def __init__(self) -> None:
        self.names: set[str] = set()         # every name bound
        self.other: set[str] = set()         # bound otherwise than by an import

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.names.add(node.id)
            self.other.add(node.id)

    def _def(self, node) -> None:
        self.names.add(node.name)
        self.other.add(node.name)
        for d in node.decorator_list:
            self.visit(d)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def

    def visit_Lambda(self, node) -> None:
        pass

    def visit_ListComp(self, node) -> None:       # comprehension variables are local
        pass

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    def visit_Import(self, node) -> None:
        for alias in node.names:
            self.names.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import


def bound_names(source: str, *, imports: bool = True) -> set[str]:
    """Names the cell binds at the top level (with ``imports=False``: other than by an import)."""
    tree = _parse(source)
    if tree is None:
        return set()
    v = _TopLevelBindings()
    v.visit(tree)
    return v.names if imports else v.other


def used_names(source: str) -> set[str]:
    """Names the cell reads from the notebook's namespace: not those it has bound itself before."""
    tree = _parse(source)
    if tree is None:
        return set(re.findall(r"[A-Za-z_]\w*", source))     # not Python: assume it may use anything
    used: set[str] = set()
    bound: set[str] = set()
    for statement in tree.body:
        used |= {n.id for n in ast.walk(statement)
                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound
        v = _TopLevelBindings()
        v.visit(statement)
        bound |= v.names
    return used


def defined_functions(source: str) -> list[str]:
    tree = _parse(source)
    return [n.name for n in (tree.body if tree else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def stub_raises(stub: str) -> bool:
    """Whether running the stub cell itself raises (a ``raise`` at the top level)."""
    tree = _parse(stub)
    return bool(tree) and any(isinstance(n, ast.Raise) for n in tree.body)


# --------------------------------------------------------------------------------------------
# One notebook
# --------------------------------------------------------------------------------------------

def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _set_tags(cell, tags: list[str]) -> None:
    tags = list(dict.fromkeys(tags))
    if tags:
        cell.metadata["tags"] = tags
    else:
        cell.metadata.pop("tags", None)


def _cleared(cell, extra_tags: list[str] = (), drop_tags: tuple[str, ...] = ()) -> None:
    cell.outputs = []
    cell.execution_count = None
    _set_tags(cell, [t for t in _tags(cell) if t not in drop_tags] + list(extra_tags))


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


def student_notebook(nb, where: str = "notebook"):
    """The student version of notebook ``nb`` (a new object) and a :class:`NotebookReport`."""
    nb = copy.deepcopy(nb)
    report = NotebookReport()
    cells = []
    in_block = False
    tainted: set[str] = set()           # names a solution defined, and names computed from them
    seen: set[str] = set()              # names the cells a student keeps have bound so far
    for index, cell in enumerate(nb.cells):
        here = f"{where}, cell {index}"
        if cell.cell_type == "markdown":
            split = split_markdown(cell.source, in_block, here)
            in_block = split.in_block
            report.solution_text.extend(split.solution)
            if split.kept.strip():
                if split.kept != cell.source.strip("\n"):
                    cell.source = split.kept
                cells.append(cell)
            else:
                report.removed_markdown += 1
            continue
        if cell.cell_type != "code":
            if in_block:
                raise StudentEditionError(f"{here}: a {cell.cell_type} cell inside a solution block")
            cells.append(cell)
            continue
        tags = _tags(cell)
        if "solution" in tags:
            stub = cell.metadata.get("stub")
            if not isinstance(stub, str) or not stub.strip():
                raise StudentEditionError(f"{here}: a cell tagged 'solution' has no student stub in its "
                                          f"metadata ('stub'); add one (see AUTHORING.md)")
            report.solution_code.append(cell.source)
            report.stub_code.append(stub)
            # what the solution defines is missing (or a stub) for the student; a name it only
            # imports again (``from kvlib.measure.flops import ...``) is the same as before, if it was there
            imported_again = (bound_names(cell.source) - bound_names(cell.source, imports=False)) & seen
            tainted |= bound_names(cell.source) - imported_again
            cell.source = stub
            del cell.metadata["stub"]
            _cleared(cell, [RAISES] if stub_raises(stub) else [], drop_tags=("solution",))
            report.stubs += 1
            cells.append(cell)
            continue
        if in_block:
            raise StudentEditionError(f"{here}: a code cell inside a solution block is not tagged 'solution', "
                                      f"so its code would reach the student edition; tag it and give it a stub")
        cell.metadata.pop("stub", None)
        if "check" in tags:
            _cleared(cell, [RAISES])
            report.checks += 1
            tainted |= bound_names(cell.source)
        elif used_names(cell.source) & tainted:
            _cleared(cell, [RAISES])
            report.dependent.append(len(cells))
            tainted |= bound_names(cell.source)
        else:
            tainted -= bound_names(cell.source)
            seen |= bound_names(cell.source)
        cells.append(cell)
    if in_block:
        raise StudentEditionError(f"{where}: a {{solution-start}} block is never closed ({{solution-end}})")
    nb.cells = cells
    return nb, report


# --------------------------------------------------------------------------------------------
# The exercises of the book, and whether they are consistent
# --------------------------------------------------------------------------------------------

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


def _exercise_heads(source: str):
    """``(label, title)`` of every ``{exercise}`` directive in a markdown cell."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if m and m.group("name") == "exercise":
            label = ""
            for opt in lines[i + 1:]:
                o = re.match(r"^\s*:label:\s*(\S+)", opt)
                if o:
                    label = o.group(1)
                if not opt.strip().startswith(":"):
                    break
            yield label, m.group("rest").strip()


# The line every exercise opens with: "*Kind: experiment · difficulty ★★☆*".
KIND_LINE = re.compile(r"^\*Kind: (?P<activity>experiment|derivation|implementation) · "
                       r"difficulty (?P<stars>★{1,3}☆{0,2})\*$")
ACTIVITIES = ("experiment", "derivation", "implementation")
_HINT = re.compile(r"^\s*(`{3,}|:{3,})\{admonition\}\s+Hint\s+\d+\s*$", re.M)


def _kind_line(source: str, label: str) -> tuple[str, int]:
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


def _solution_labels(source: str) -> list[str]:
    return [m.group("rest").strip() for m in map(_FENCE.match, source.splitlines())
            if m and m.group("name") in ("solution", "solution-start")]


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
                for label, title in _exercise_heads(cell.source):
                    number = sum(e.notebook == path.name for e in found) + 1
                    current = Exercise(section, number, label, title, "question", path.name)
                    current.activity, current.difficulty = _kind_line(cell.source, label)
                    found.append(current)
                if current is not None and not current.has_solution:
                    current.hints += len(_HINT.findall(cell.source))
                for label in _solution_labels(cell.source):
                    for e in found:
                        if e.label == label:
                            e.has_solution = True
            elif current is None and cell.cell_type == "code" and {"solution", "check"} & set(_tags(cell)):
                if orphans is not None:
                    orphans.append(f"{path.name}: a cell tagged {sorted({'solution', 'check'} & set(_tags(cell)))} "
                                   f"comes before any {{exercise}}")
            elif current is not None and cell.cell_type == "code":
                tags = _tags(cell)
                if "solution" in tags:
                    current.functions += defined_functions(cell.source)
                    current.stubs.append(cell.metadata.get("stub", ""))
                if "check" in tags:
                    current.kind = "code"
                    current.checks.append(cell.source)
    return found


def consistency_problems(root: Path = ROOT) -> list[str]:
    """Everything that would make an exercise unusable: each line says what and where."""
    problems: list[str] = []
    exercises = book_exercises(root, orphans=problems)
    labels = [e.label for e in exercises]
    for e in exercises:
        where = f"{e.notebook}, {e.name} ({e.label or 'no label'})"
        if not e.label:
            problems.append(f"{where}: the {{exercise}} has no :label:")
        elif labels.count(e.label) > 1:
            problems.append(f"{where}: the label {e.label} is used more than once")
        elif not re.fullmatch(rf"ex-[a-z0-9]+-{e.number}", e.label):
            problems.append(f"{where}: the label should be ex-<section>-{e.number} (exercises are numbered in order)")
        if not e.title:
            problems.append(f"{where}: the {{exercise}} has no title")
        if not e.has_solution:
            problems.append(f"{where}: no {{solution}} or {{solution-start}} block with this label")
        if not e.activity:
            problems.append(f"{where}: the statement should open with its kind line, e.g. "
                            f"'*Kind: experiment · difficulty ★★☆*' (experiment, derivation or implementation)")
        if not 1 <= e.hints <= 3:
            problems.append(f"{where}: {e.hints} hints; give one to three ('{{admonition}} Hint 1', "
                            f"':class: dropdown') between the statement and the solution")
        for stub in e.stubs:
            if not stub.strip():
                problems.append(f"{where}: a solution cell has no stub")
            elif not re.search(rf"\bExercise {e.section}\.{e.number}\b", stub):
                problems.append(f"{where}: its stub should name the exercise, '{e.name}', so that the student "
                                f"knows which one is not written yet")
        for fn in e.functions:
            if not any(re.search(rf"\bcheck_\w+\(\s*{re.escape(fn)}\s*[,)]", c) for c in e.checks):
                problems.append(f"{where}: the solution defines {fn}() but no check cell after it calls "
                                f"check_<name>({fn})")
        for c in e.checks:
            called = re.findall(r"\bcheck_\w+\(\s*(\w+)", c)
            if not called:
                problems.append(f"{where}: a check cell calls no check_<name>(<function>)")
            for fn in called:
                if fn not in e.functions:
                    problems.append(f"{where}: a check cell checks {fn}, which no solution of this exercise defines")
    for section, path in notebooks_in_order(root):
        mine = [e for e in exercises if e.section == section]
        if mine and not any(e.activity == "experiment" for e in mine):
            problems.append(f"{path.name}: no experiment among its exercises; every section asks for at least one "
                            f"(predict, run, explain)")
    return problems


def exercise_counts(root: Path = ROOT) -> dict[int, int]:
    counts = {section: 0 for section, _ in notebooks_in_order(root)}
    for e in book_exercises(root):
        counts[e.section] += 1
    return counts


# --------------------------------------------------------------------------------------------
# The book around the notebooks: config, toc, README
# --------------------------------------------------------------------------------------------

def _remove_block(lines: list[str], index: int) -> list[str]:
    """Remove the YAML key at ``lines[index]``, its nested lines and the comments just above it."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    end = index + 1
    while end < len(lines) and (not lines[end].strip()
                                or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    start = index
    while start > 0 and lines[start - 1].strip().startswith("#") and \
            len(lines[start - 1]) - len(lines[start - 1].lstrip()) == indent:
        start -= 1
    return lines[:start] + lines[end:]


def _find_key(lines: list[str], key: str) -> int | None:
    for i, line in enumerate(lines):
        if re.match(rf"^\s*{re.escape(key)}:", line):
            return i
    return None


def student_config(root: Path, out: Path) -> str:
    """``_config.yml`` for the student edition: the book's, adjusted to be built from ``out``."""
    text = (root / "_config.yml").read_text(encoding="utf-8")
    lines = text.splitlines()
    rel = Path(os.path.relpath(root, out)).as_posix()

    def to_root(path: str) -> str:
        return path if os.path.isabs(path) else f"{rel}/{path}"

    out_lines = []
    ext_indent = None                  # inside sphinx: local_extensions: (its indentation)
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if ext_indent is not None and line.strip() and indent <= ext_indent:
            ext_indent = None
        if re.match(r"^\s+local_extensions:\s*$", line):
            ext_indent = indent
        m = re.match(r"^title:\s*(.*)$", line)
        if m:
            title = m.group(1).strip().strip("\"'")
            line = f'title: "{title} (student edition)"'
        line = re.sub(r"^(\s*execute_notebooks:).*$", r'\1 "off"   # students run the notebooks themselves', line)
        line = re.sub(r"^(\s*use_repository_button:).*$", r"\1 false", line)
        m = re.match(r"^(\s+)([\w.-]+):\s*['\"]?([^'\"#\s]+)['\"]?\s*(#.*)?$", line)
        if ext_indent is not None and indent > ext_indent and m:
            line = f"{m.group(1)}{m.group(2)}: {to_root(m.group(3))}"      # name: folder, from the book's root
        m = re.match(r"^(\s*html_extra_path:\s*)\[(.*)\]\s*$", line)
        if m:
            paths = [p.strip().strip("\"'") for p in m.group(2).split(",") if p.strip()]
            line = m.group(1) + "[" + ", ".join(json.dumps(to_root(p)) for p in paths) + "]"
        out_lines.append(line)
    lines = out_lines

    # Launch buttons would open the instructors' notebooks, solutions and all: none here.
    i = _find_key(lines, "launch_buttons")
    if i is not None:
        lines = _remove_block(lines, i)
    # The offline assets (widgets, MathJax) are served from the main book's build folder; where
    # they have not been fetched, keep the CDN defaults (as the Makefile does for the main book).
    i = _find_key(lines, "html_extra_path")
    if i is not None:
        paths = re.findall(r'"([^"]+)"', lines[i])
        if not all((out / p).is_dir() for p in paths):
            for key in ("html_extra_path", "mathjax_path", "nb_ipywidgets_js"):
                j = _find_key(lines, key)
                if j is not None:
                    lines = _remove_block(lines, j)
    header = ("# The student edition, written by scripts/student_edition.py from the book's _config.yml:\n"
              "# do not edit (run `make student` again).\n")
    return header + "\n".join(lines) + "\n"


def student_toc(root: Path) -> str:
    keep = []
    for line in (root / "_toc.yml").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*(?:-\s+)?file:\s*['\"]?([^'\"#\s]+)", line)
        if m and re.sub(r"\.(ipynb|md)$", "", m.group(1)) in INSTRUCTOR_ONLY:
            continue
        keep.append(line)
    return ("# The student edition's table of contents (scripts/student_edition.py): do not edit.\n"
            + "\n".join(keep) + "\n")


STUDENT_README = """\
# {title}: student edition

These are the notebooks of the chapter with the exercises left for you: every exercise
that asks for code has a cell with a function to write, which at first only raises
`NotImplementedError("Exercise N.M: ...")`, and below it a check cell.

1. Install the chapter's Python package `kvlib` (your instructor tells you how; from a copy of
   the course repository it is `make setup`, or `pip install -e .` there).
2. Open the notebooks in `chapters/` in order, in JupyterLab or Jupyter Notebook, and run them.
3. For each code exercise, replace the `raise NotImplementedError(...)` with your code and run
   the cell, then the check cell below it. The check runs your function on several inputs,
   including edge cases, and prints one verdict: `✓ Exercise N.M: all ... cases pass`, or the
   first case that went wrong, with the input, what was expected and what your function gave,
   and often a hint naming the mistake.
4. Questions without code: write your answer in the notebook (a markdown cell) before class.

The check cells raise an error until your function is right; that is expected. A passing check
means your function gave the right answer on all its cases, not that it is the only right way
to write it.

To build this edition as a web book: `jupyter-book build .` in this folder (the notebooks are
shown with their stored outputs).
"""


def _title(root: Path) -> str:
    m = re.search(r'^title:\s*"?([^"\n]*)"?', (root / "_config.yml").read_text(encoding="utf-8"), re.M)
    return m.group(1).strip() if m else "The book"


# --------------------------------------------------------------------------------------------
# Writing the edition, and checking that no solution got through
# --------------------------------------------------------------------------------------------

def write_edition(root: Path, out: Path, *, quiet: bool = False) -> dict[str, NotebookReport]:
    """Write the student edition of the book at ``root`` into ``out``; return what was done per notebook."""
    root, out = root.resolve(), out.resolve()
    if out == root or root.is_relative_to(out):
        raise StudentEditionError(f"the student edition cannot be written over the book itself ({out})")
    reports: dict[str, NotebookReport] = {}
    entries = toc_entries(root)
    pages = [(entry, _page_file(root, entry)) for entry in entries if entry not in INSTRUCTOR_ONLY]
    # transform everything first, so that an error leaves the previous edition untouched
    transformed = {}
    for entry, path in pages:
        if path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            transformed[path], reports[path.relative_to(root).as_posix()] = student_notebook(
                nb, path.relative_to(root).as_posix())
    problems = consistency_problems(root)
    if problems:
        raise StudentEditionError("the exercises are not consistent:\n  " + "\n  ".join(problems))
    for sub in {Path(entry).parts[0] for entry, _ in pages if len(Path(entry).parts) > 1}:
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    out.mkdir(parents=True, exist_ok=True)
    page_paths = {p.resolve() for _, p in pages}
    instructor_paths = {(root / e).with_suffix(s).resolve() for e in INSTRUCTOR_ONLY for s in (".md", ".ipynb")}
    for entry, path in pages:
        target = out / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path in transformed:
            nbformat.write(transformed[path], target)
        else:
            shutil.copy2(path, target)
    # other files next to the pages (images, data): everything but notebooks and instructor pages
    for folder in {path.parent for _, path in pages}:
        for f in folder.rglob("*"):
            if (f.is_file() and f.suffix != ".ipynb" and f.resolve() not in page_paths
                    and f.resolve() not in instructor_paths and ".ipynb_checkpoints" not in f.parts
                    and not f.name.startswith(".")):
                target = out / f.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
    (out / "_config.yml").write_text(student_config(root, out), encoding="utf-8")
    (out / "_toc.yml").write_text(student_toc(root), encoding="utf-8")
    (out / "README.md").write_text(STUDENT_README.format(title=_title(root)), encoding="utf-8")
    if not quiet:
        for name, r in reports.items():
            print(f"  {name}: {r.stubs} stubs, {r.checks} checks, {len(r.dependent)} cells that use a "
                  f"solution cleared, {r.removed_markdown} solution cells removed")
        print(f"Student edition written to {out}")
    return reports


def solution_fragments(root: Path = ROOT, min_len: int = 12) -> dict[str, list[str]]:
    """The lines of solution code and text that must not appear in the student edition.

    Each non-trivial line (``min_len`` characters or more, stripped) of every solution cell and
    solution block, leaving out lines that also occur in a stub or anywhere in the cells a
    student does see (the statement may quote a line of the solution).
    """
    out: dict[str, list[str]] = {}
    for _, path in notebooks_in_order(root):
        nb = nbformat.read(path, as_version=4)
        student, report = student_notebook(nb, path.name)
        visible = "\n".join(c.source for c in student.cells)
        fragments = []
        for block in report.solution_code + report.solution_text:
            for line in block.splitlines():
                s = line.strip()
                if (len(s) >= min_len and s not in visible and s not in fragments
                        and not re.match(r"^:[a-z-]+:( |$)", s)):     # ":class: dropdown": markup, not content
                    fragments.append(s)
        out[path.name] = fragments
    return out


def _searchable_texts(path: Path) -> list[str]:
    """A file's text, and the forms its content takes once decoded (JSON strings, HTML text)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []
    texts = [raw]
    if path.suffix in (".ipynb", ".json"):
        try:
            def strings(x):
                if isinstance(x, str):
                    yield x
                elif isinstance(x, dict):
                    for v in x.values():
                        yield from strings(v)
                elif isinstance(x, list):
                    for v in x:
                        yield from strings(v)
            texts.append("\n".join(strings(json.loads(raw))))
        except ValueError:
            pass
    if path.suffix in (".html", ".htm"):
        texts.append(html.unescape(re.sub(r"<[^>]+>", "", raw)))
    return texts


def find_leaks(root: Path, out: Path) -> list[str]:
    """Every solution line found in a file under ``out``, as ``'file: line'``."""
    fragments = solution_fragments(root)
    leaks = []
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        texts = _searchable_texts(f)
        if not texts:
            continue
        for nb, lines in fragments.items():
            for line in lines:
                if any(line in t for t in texts):
                    leaks.append(f"{f.relative_to(out)}: {line!r} (from a solution in {nb})")
    return leaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="student", help="where to write the edition (default: student/)")
    parser.add_argument("--root", default=str(ROOT), help="the book (default: this repository)")
    parser.add_argument("--check", action="store_true", help="only check that the exercises are consistent")
    parser.add_argument("--leaks", action="store_true",
                        help="only scan --out (the edition and its build) for solution text")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    out = Path(args.out)
    out = out if out.is_absolute() else root / out
    try:
        if args.check:
            problems = consistency_problems(root)
            for p in problems:
                print("✗", p)
            counts = exercise_counts(root)
            print("exercises per section:", ", ".join(f"{s}: {n}" for s, n in counts.items()))
            return 1 if problems else 0
        if args.leaks:
            leaks = find_leaks(root, out)
            for leak in leaks[:40]:
                print("✗ solution text in the student edition:", leak)
            if leaks:
                return 1
            print(f"✓ no solution text under {out}")
            return 0
        write_edition(root, out, quiet=args.quiet)
    except StudentEditionError as e:
        print(f"student edition: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
