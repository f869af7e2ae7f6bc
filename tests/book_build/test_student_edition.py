"""The student edition (book/student_edition/) holds no solution, and everything else.

The edition is written into a temporary folder. The solutions are found here again, from the
notebooks' tags and directives, with a parser of this file's own (not the package's), and
every non-trivial line of each one is searched for in every file written, as text.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from book import student_edition as se

ROOT = Path(__file__).resolve().parents[2]

MIN_LEN = 12


def _toc_notebooks(root: Path = ROOT) -> list[tuple[int, Path]]:
    """(section number, path) of the notebooks in _toc.yml order: the root page is not numbered."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    entries = [toc["root"]] + [c["file"] for c in toc.get("chapters", [])]
    return [(i, root / f"{e}.ipynb") for i, e in enumerate(entries) if (root / f"{e}.ipynb").exists()]


NOTEBOOKS = _toc_notebooks()


# --- the solutions, found independently of the script ------------------------------------------

_OPEN = re.compile(r"^\s*(`{3,}|:{3,})\{(solution|solution-start|solution-end)\}")


def _split_markdown(text: str, in_block: bool):
    """(visible lines, solution lines, still in a solution-start block)."""
    visible, hidden = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        kind = m.group(2) if m else None
        if kind in ("solution", "solution-start", "solution-end"):
            fence = m.group(1)
            j = i + 1
            while j < len(lines) and not (lines[j].strip() and set(lines[j].strip()) == {fence[0]}
                                          and len(lines[j].strip()) >= len(fence)):
                if kind == "solution":
                    hidden.append(lines[j])
                j += 1
            in_block = {"solution-start": True, "solution-end": False}.get(kind, in_block)
            i = j + 1
            continue
        (hidden if in_block else visible).append(lines[i])
        i += 1
    return visible, hidden, in_block


def _solutions(path: Path):
    """(solution code blocks, solution text lines, stubs, visible text) of one source notebook."""
    nb = nbformat.read(path, as_version=4)
    code, text, stubs, visible = [], [], [], []
    in_block = False
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            v, h, in_block = _split_markdown(cell.source, in_block)
            visible += v
            text += h
        elif "solution" in tags:
            code.append(cell.source)
            stubs.append(cell.metadata.get("stub", ""))
        else:
            visible += cell.source.splitlines()
    return code, text, stubs, visible


# A directive's option line (":class: dropdown") is markup that hints share with solutions, not a solution's content.
_DIRECTIVE_OPTION = re.compile(r"^:[a-z-]+:( |$)")


def _fragments(path: Path) -> list[str]:
    code, text, stubs, visible = _solutions(path)
    seen = "\n".join(visible + stubs)
    out = []
    for block in code + ["\n".join(text)]:
        for line in block.splitlines():
            s = line.strip()
            if len(s) >= MIN_LEN and s not in seen and not _DIRECTIVE_OPTION.match(s):
                out.append(s)
    return out


def _all_text(out: Path) -> dict[Path, str]:
    """Every file under ``out`` as text: the raw file, and for JSON files every string in it decoded."""
    texts = {}
    for f in out.rglob("*"):
        if not f.is_file():
            continue
        raw = f.read_text(encoding="utf-8", errors="replace")
        if f.suffix in (".ipynb", ".json"):
            def strings(x):
                if isinstance(x, str):
                    yield x
                elif isinstance(x, dict):
                    for v in x.values():
                        yield from strings(v)
                elif isinstance(x, list):
                    for v in x:
                        yield from strings(v)
            raw += "\n" + "\n".join(strings(json.loads(raw)))
        texts[f] = raw
    return texts


# --- the edition, written once for the module ---------------------------------------------------

@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    reports = se.write_edition(ROOT, out, quiet=True)
    return out, reports


def _student(out: Path, path: Path):
    return nbformat.read(out / path.relative_to(ROOT), as_version=4)


def test_the_book_has_solutions_to_hide():
    assert sum(len(_fragments(p)) for _, p in NOTEBOOKS) > 50


def test_every_notebook_is_written(edition):
    out, _ = edition
    written = sorted(p.name for p in (out / "chapters").glob("*.ipynb"))
    assert written == sorted(p.name for _, p in NOTEBOOKS)


def test_no_line_of_any_solution_survives(edition):
    out, _ = edition
    texts = _all_text(out)
    leaks = [f"{f.relative_to(out)}: {frag!r}"
             for _, path in NOTEBOOKS for frag in _fragments(path)
             for f, text in texts.items() if frag in text]
    assert not leaks, "solution text in the student edition:\n" + "\n".join(leaks[:20])


def test_the_solution_markdown_is_gone(edition):
    out, _ = edition
    for _, path in NOTEBOOKS:
        text = "\n".join(c.source for c in _student(out, path).cells)
        assert "{solution" not in text, path.name
        _, hidden, _, _ = _solutions(path)
        for line in hidden:
            if len(line.strip()) >= MIN_LEN and line.strip() not in "\n".join(_solutions(path)[3]):
                assert line.strip() not in text


def test_the_scripts_own_leak_scan_agrees(edition):
    out, _ = edition
    assert se.find_leaks(ROOT, out) == []
    # and it does find a solution line put back on purpose
    path = NOTEBOOKS[1][1]
    planted = out / "planted.txt"
    planted.write_text(_fragments(path)[0])
    try:
        assert se.find_leaks(ROOT, out)
    finally:
        planted.unlink()


def test_check_cells_are_tagged_to_raise_and_cleared(edition):
    out, _ = edition
    checks = 0
    for _, path in NOTEBOOKS:
        for cell in _student(out, path).cells:
            if "check" in cell.metadata.get("tags", []):
                checks += 1
                assert "raises-exception" in cell.metadata["tags"]
                assert cell.outputs == [] and cell.execution_count is None
    assert checks >= 6


def _stub_cells(out: Path, section: int, path: Path):
    """The student cells that are stubs, each with its exercise ("1.2") in order."""
    src = nbformat.read(path, as_version=4)
    stubs = [c.metadata["stub"] for c in src.cells if "solution" in c.metadata.get("tags", [])]
    cells = [c for c in _student(out, path).cells if c.cell_type == "code" and c.source in stubs]
    assert len(cells) == len(stubs), f"{path.name}: every solution cell becomes its stub"
    return cells


def test_stubs_raise_not_implemented_with_the_exercise_number(edition):
    out, _ = edition
    exercises = {(e.section, e.label): e for e in se.book_exercises(ROOT)}
    seen = 0
    for section, path in NOTEBOOKS:
        for cell in _stub_cells(out, section, path):
            assert "solution" not in cell.metadata.get("tags", [])
            assert "stub" not in cell.metadata
            assert cell.outputs == [] and cell.execution_count is None
            m = re.search(rf"Exercise ({section})\.(\d+)", cell.source)
            assert m, f"{path.name}: the stub does not name its exercise:\n{cell.source}"
            namespace: dict = {}
            exec(compile(cell.source, f"{path.name} stub", "exec"), namespace)
            functions = [v for k, v in namespace.items() if callable(v) and not k.startswith("__")]
            for fn in functions:
                n_args = fn.__code__.co_argcount - len(fn.__defaults__ or ())
                with pytest.raises(NotImplementedError, match=rf"Exercise {section}\.{m.group(2)}\b"):
                    fn(*[None] * n_args)
                seen += 1
            if not functions:                  # a question's worksheet cell: comments only, runs quietly
                assert all(not ln.strip() or ln.lstrip().startswith("#") for ln in cell.source.splitlines())
    assert seen >= 6 and exercises


def test_a_stub_that_raises_by_itself_is_tagged():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("answer = 42", metadata={"tags": ["solution"],
                                                             "stub": 'raise NotImplementedError("Exercise 1.1")'})
    quiet = nbformat.v4.new_code_cell("def f():\n    return 1", metadata={"tags": ["solution"],
                                                                       "stub": 'def f():\n    raise NotImplementedError("Exercise 1.2")'})
    nb.cells = [cell, quiet]
    student, report = se.student_notebook(nb)
    assert student.cells[0].metadata["tags"] == ["raises-exception"]
    assert "tags" not in student.cells[1].metadata
    assert report.stubs == 2


def test_other_cells_are_the_same_and_in_the_same_order(edition):
    out, _ = edition
    for _, path in NOTEBOOKS:
        src = nbformat.read(path, as_version=4)
        expected, in_block = [], False
        for cell in src.cells:
            if cell.cell_type == "markdown":
                visible, _, in_block = _split_markdown(cell.source, in_block)
                text = "\n".join(visible).strip("\n")
                if text.strip():
                    expected.append(("markdown", text))
            elif "solution" not in cell.metadata.get("tags", []):
                expected.append((cell.cell_type, cell.source))
        stubs = {c.metadata["stub"] for c in src.cells if "solution" in c.metadata.get("tags", [])}
        got = [(c.cell_type, c.source.strip("\n") if c.cell_type == "markdown" else c.source)
               for c in _student(out, path).cells if not (c.cell_type == "code" and c.source in stubs)]
        assert got == expected, path.name


def test_outputs_are_kept_except_where_a_stub_is_used(edition):
    out, reports = edition
    for _, path in NOTEBOOKS:
        src = [c for c in nbformat.read(path, as_version=4).cells
               if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
        stub_sources = {c.metadata["stub"] for c in nbformat.read(path, as_version=4).cells if "stub" in c.metadata}
        dst = [c for c in _student(out, path).cells if c.cell_type == "code" and c.source not in stub_sources]
        assert len(src) == len(dst)
        solution_names = set()
        for c in nbformat.read(path, as_version=4).cells:
            if "solution" in c.metadata.get("tags", []):
                solution_names |= se.bound_names(c.source)
        for a, b in zip(src, dst):
            tags = b.metadata.get("tags", [])
            if "raises-exception" in tags and "raises-exception" not in a.metadata.get("tags", []):
                assert b.outputs == [] and b.execution_count is None
                assert "check" in tags or se.used_names(b.source), b.source
            else:
                assert b.outputs == a.outputs and b.execution_count == a.execution_count, b.source[:80]
    # the cells that use a student's function are cleared: e.g. section 4's predicted-vs-measured
    assert any(r.dependent for r in reports.values())


def test_book_config_and_toc_build_the_edition(edition):
    out, _ = edition
    config = yaml.safe_load((out / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "off"
    assert "launch_buttons" not in config                  # they would open the notebooks with solutions
    assert config["html"]["use_repository_button"] is False
    assert "student edition" in config["title"]
    for name, folder in (config["sphinx"].get("local_extensions") or {}).items():
        assert (out / folder / f"{name}.py").exists()
    for folder in config["sphinx"]["config"].get("html_extra_path", []):
        assert (out / folder).is_dir()
    toc = yaml.safe_load((out / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for c in toc["chapters"]]
    for f in files:
        assert (out / f"{f}.ipynb").exists() or (out / f"{f}.md").exists(), f
    assert not any(f in se.INSTRUCTOR_ONLY for f in files)
    assert not list(out.rglob("instructors*"))
    assert (out / "chapters" / "index.md").read_text() == (ROOT / "chapters" / "index.md").read_text()
    assert "NotImplementedError" in (out / "README.md").read_text()
    # the notebooks' licence (CC BY 4.0) travels with them
    assert (out / "LICENSE-text").read_text() == (ROOT / "LICENSE-text").read_text()
    assert "CC BY 4.0" in (out / "README.md").read_text()


def test_the_exercises_are_consistent():
    assert se.consistency_problems(ROOT) == []


# --- a book that is broken on purpose -----------------------------------------------------------

def _tiny_book(tmp_path: Path, cells) -> Path:
    root = tmp_path / "book"
    (root / "chapters").mkdir(parents=True)
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    (root / "_toc.yml").write_text("format: jb-book\nroot: chapters/index\nchapters:\n  - file: chapters/01_one\n"
                                   "  - file: chapters/instructors\n")
    (root / "chapters" / "index.md").write_text("# Index\n")
    (root / "chapters" / "instructors.md").write_text("# For instructors\n")
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    nbformat.write(nb, root / "chapters" / "01_one.ipynb")
    return root


HINT = "```{admonition} Hint 1\n:class: dropdown\n\nMultiply.\n```"


def _exercise(stub: str | None = 'def f(x):\n    raise NotImplementedError("Exercise 1.1: write f")',
              check: str | None = "from kvlib.exercises import check_f\ncheck_f(f)"):
    meta = {"tags": ["solution"]}
    if stub is not None:
        meta["stub"] = stub
    cells = [
        nbformat.v4.new_markdown_cell("# One\n\n```{exercise} Write f\n:label: ex-one-1\n\n"
                                      "*Kind: experiment · difficulty ★☆☆*\n\nWrite f.\n```"),
        nbformat.v4.new_markdown_cell(HINT),
        nbformat.v4.new_markdown_cell("```{solution-start} ex-one-1\n:class: dropdown\n```\nThe secret explanation."),
        nbformat.v4.new_code_cell("def f(x):\n    return x * 12345678  # the secret solution", metadata=meta),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```"),
    ]
    if check is not None:
        cells.append(nbformat.v4.new_code_cell(check, metadata={"tags": ["check"]}))
    return cells


def test_the_tiny_book_is_fine(tmp_path):
    root = _tiny_book(tmp_path, _exercise())
    assert se.consistency_problems(root) == []
    se.write_edition(root, root / "student", quiet=True)
    text = (root / "student" / "chapters" / "01_one.ipynb").read_text()
    assert "secret" not in text and "Exercise 1.1: write f" in text
    assert not (root / "student" / "chapters" / "instructors.md").exists()


def test_a_solution_without_a_stub_stops_the_edition_loudly(tmp_path, capsys):
    root = _tiny_book(tmp_path, _exercise(stub=None))
    with pytest.raises(se.StudentEditionError, match=r"01_one.ipynb.*cell 3.*no student stub"):
        se.write_edition(root, root / "student", quiet=True)
    assert not (root / "student").exists()                     # nothing half-written
    assert se.main(["--root", str(root), "--out", "student"]) == 2
    assert "no student stub" in capsys.readouterr().err


def test_an_untagged_code_cell_inside_a_solution_block_stops_the_edition(tmp_path):
    cells = _exercise()
    cells[3].metadata["tags"] = []
    root = _tiny_book(tmp_path, cells)
    with pytest.raises(se.StudentEditionError, match="inside a solution block is not tagged"):
        se.write_edition(root, root / "student", quiet=True)


def test_an_unclosed_solution_block_stops_the_edition(tmp_path):
    root = _tiny_book(tmp_path, _exercise()[:4])
    with pytest.raises(se.StudentEditionError, match="never closed"):
        se.write_edition(root, root / "student", quiet=True)


@pytest.mark.parametrize("kwargs, problem", [
    (dict(check=None), r"defines f\(\) but no check cell"),
    (dict(check="from kvlib.exercises import check_g\ncheck_g(g)"), r"checks g, which no solution"),
    (dict(stub='def f(x):\n    raise NotImplementedError("write f")'), r"stub should name the exercise, 'Exercise 1.1'"),
    (dict(stub='def f(x):\n    raise NotImplementedError("Exercise 2.1: write f")'), r"'Exercise 1.1'"),
])
def test_inconsistent_exercises_are_reported(tmp_path, kwargs, problem):
    root = _tiny_book(tmp_path, _exercise(**kwargs))
    problems = se.consistency_problems(root)
    assert any(re.search(problem, p) for p in problems), problems
    with pytest.raises(se.StudentEditionError, match="not consistent"):
        se.write_edition(root, root / "student", quiet=True)


def _with(cells, i, old, new):
    cells[i].source = cells[i].source.replace(old, new)
    return cells


@pytest.mark.parametrize("change, problem", [
    (lambda c: _with(c, 0, "*Kind: experiment · difficulty ★☆☆*", "Difficulty: easy"), r"open with its kind line"),
    (lambda c: _with(c, 0, "*Kind: experiment", "*Kind: puzzle"), r"open with its kind line"),
    (lambda c: _with(c, 0, "★☆☆", "★★★★"), r"open with its kind line"),
    (lambda c: _with(c, 0, "*Kind: experiment · difficulty ★☆☆*\n\nWrite f.", "Write f.\n\n*Kind: experiment · difficulty ★☆☆*"),
     r"open with its kind line"),
    (lambda c: c[:1] + c[2:], r"0 hints; give one to three"),
    (lambda c: c[:1] + [nbformat.v4.new_markdown_cell(HINT.replace("1", str(n))) for n in range(1, 5)] + c[2:],
     r"4 hints; give one to three"),
    (lambda c: c[:1] + c[2:4] + [c[1]] + c[4:], r"0 hints"),                   # a hint after the solution
    (lambda c: _with(c, 0, "*Kind: experiment", "*Kind: implementation"), r"no experiment among its exercises"),
])
def test_an_exercise_without_its_kind_hints_or_experiment_is_reported(tmp_path, change, problem):
    root = _tiny_book(tmp_path, change(_exercise()))
    problems = se.consistency_problems(root)
    assert any(re.search(problem, p) for p in problems), problems


def test_kind_difficulty_and_hints_are_read():
    by_label = {e.label: e for e in se.book_exercises(ROOT)}
    assert {e.activity for e in by_label.values()} == set(se.ACTIVITIES)
    assert all(1 <= e.difficulty <= 3 and 1 <= e.hints <= 3 for e in by_label.values())


def test_a_wrongly_numbered_label_is_reported(tmp_path):
    cells = _exercise()
    cells[0].source = cells[0].source.replace("ex-one-1", "ex-one-2")
    cells[2].source = cells[2].source.replace("ex-one-1", "ex-one-2")
    problems = se.consistency_problems(_tiny_book(tmp_path, cells))
    assert any("numbered in order" in p for p in problems), problems


def test_a_question_with_its_solution_in_the_same_cell(tmp_path):
    cells = [nbformat.v4.new_markdown_cell(
        "```{exercise} Think\n:label: ex-one-1\n\n*Kind: experiment · difficulty ★★★*\n\nWhy?\n```\n\n" + HINT + "\n\n"
        "````{solution} ex-one-1\n:class: dropdown\n\nBecause of the hidden reason.\n```python\nx = 1\n```\n````\n\nAfter.")]
    root = _tiny_book(tmp_path, cells)
    assert se.consistency_problems(root) == []
    se.write_edition(root, root / "student", quiet=True)
    md = nbformat.read(root / "student" / "chapters" / "01_one.ipynb", as_version=4).cells[0].source
    assert "Why?" in md and "After." in md and "Multiply." in md           # the hint stays
    assert "hidden reason" not in md and "{solution}" not in md and "x = 1" not in md


def test_cells_that_use_a_solution_are_cleared_and_only_those():
    def code(src, **meta):
        cell = nbformat.v4.new_code_cell(src, metadata=meta)
        cell.outputs = [nbformat.v4.new_output("stream", text="stored\n")]
        cell.execution_count = 1
        return cell
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        code("from math import sqrt\nx = 4"),
        code("from math import sqrt\ndef root(v):\n    return sqrt(v)\nanswer = root(x)",
             tags=["solution"], stub='def root(v):\n    raise NotImplementedError("Exercise 1.1")'),
        code("print(sqrt(x))"),                    # sqrt was imported before: not the solution's
        code("y = root(9)\nprint(y)"),             # calls the student's function: cleared
        code("print(y + 1)"),                      # computed from it: cleared too
        code("y = 3\nprint(y)"),                   # bound afresh: kept
        code("print(answer)"),                     # a result of the solution: cleared
    ]
    student, report = se.student_notebook(nb)
    cleared = [i for i, c in enumerate(student.cells) if "raises-exception" in c.metadata.get("tags", [])]
    assert cleared == [3, 4, 6] and report.dependent == [3, 4, 6]
    for i in (0, 2, 5):
        assert student.cells[i].outputs and student.cells[i].execution_count == 1
    for i in cleared:
        assert student.cells[i].outputs == [] and student.cells[i].execution_count is None


# --- the flow check: every untagged cell runs with the stubs in place ---------------------------

STUB_F = 'def f(v):\n    raise NotImplementedError("Exercise 1.1: write f")'


def _code(src: str, *tags: str):
    return nbformat.v4.new_code_cell(src, metadata={"tags": list(tags)} if tags else {})


def _notebook(cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# One")] + cells
    return nb


def _problem_cells(problems: list[str]) -> list[int]:
    return [int(re.search(r"cell (\d+) ", p).group(1)) for p in problems]


@pytest.mark.parametrize("source_of_r", [
    "from kvlib.exercises import check_f\nr = check_f(f)",     # bound by a check cell
    "r = f(4)",                                                  # bound by a cell that used the stub's function
])
def test_an_untagged_cell_two_cells_deep_is_reported(source_of_r):
    tags = ["check", "raises-exception"] if "check_f" in source_of_r else ["raises-exception"]
    nb = _notebook([
        _code("x = 4"),                                 # cell 1: runs
        _code(STUB_F),                                  # cell 2: the stub: defining f runs, calling it raises
        _code(source_of_r, *tags),                      # cell 3: raises, so r is bound by nothing that runs
        _code("s = r + 1"),                             # cell 4: uses r
        _code("t = [s * k for k in range(3)]"),         # cell 5: uses s, two cells deep
        _code("print(x, [k for k in range(3)])"),       # cell 6: runs (k is the comprehension's own)
        _code("t = 7\nprint(t)"),                       # cell 7: binds t afresh: runs
    ])
    problems = se.flow_problems(nb)
    assert _problem_cells(problems) == [4, 5], problems
    assert "uses `r`, bound only by cell 3, which raises with the stubs in place: tag it raises-exception" in problems[0]
    assert "uses `s`, bound only by cell 4" in problems[1]
    for i in (4, 5):                                   # tagged as the writer tags them: no problem left
        nb.cells[i].metadata["tags"] = ["raises-exception"]
    report = se.check_flow(nb)
    assert report.problems == [] and report.warnings == []


def test_a_call_of_a_stub_and_an_untagged_check_are_reported():
    nb = _notebook([_code(STUB_F), _code("from kvlib.exercises import check_f\ncheck_f(f)", "check"),
                    _code("print(f(2))"), _code("def g(v):\n    return f(v) + 1"),
                    _code('raise NotImplementedError("Exercise 1.2: write h")')])
    problems = se.flow_problems(nb)
    assert _problem_cells(problems) == [2, 3, 4, 5], problems
    assert "is a check cell" in problems[0]
    assert "uses `f`, which cell 1 defines to raise when called" in problems[1]
    assert "raises by itself" in problems[3]


def test_a_tagged_cell_that_uses_nothing_tainted_is_only_a_warning():
    nb = _notebook([_code("x = 4"), _code("print(x)", "raises-exception")])
    report = se.check_flow(nb)
    assert report.problems == []
    assert len(report.warnings) == 1 and "cell 2 is tagged raises-exception" in report.warnings[0]


def _source_book_notebook():
    """A source notebook (solutions and stubs) whose dependent cells need the transitive flow."""
    def solution(src, stub):
        return nbformat.v4.new_code_cell(src, metadata={"tags": ["solution"], "stub": stub})
    return _notebook([
        _code("x = 1 / 0", "raises-exception"),         # 1: raises in the book too: binds nothing
        _code("print(x)"),                              # 2: so this one raises
        solution("def f(v):\n    return v", STUB_F),    # 3
        _code("y = f(2)"),                              # 4: calls the stub
        _code("y += 1"),                                # 5: reads y (an augmented assignment)
        _code("print(y)"),                              # 6: two cells deep
        solution("g = f(3)", "g = f(0)  # Exercise 1.2: replace f(0)"),   # 7: the stub itself calls f
        _code("print(g)"),                              # 8
        _code("print(1 + 1)"),                          # 9: runs
    ])


def test_the_writer_tags_by_the_same_transitive_flow():
    student, report = se.student_notebook(_source_book_notebook())
    tagged = [i for i, c in enumerate(student.cells) if "raises-exception" in c.metadata.get("tags", [])]
    assert tagged == [1, 2, 4, 5, 6, 7, 8]
    assert report.dependent == [2, 4, 5, 6, 8]
    assert se.flow_problems(student) == []
    assert student.cells[9].metadata.get("tags") is None


def test_the_books_fresh_edition_has_no_flow_problems(edition):
    out, _ = edition
    report = se.check_flow(out)
    assert report.notebooks == len(NOTEBOOKS) and report.cells > 100
    assert report.problems == [], "\n".join(report.problems)
    assert report.warnings == [], "\n".join(report.warnings)


def _untag(out: Path, copy: Path, notebook: str, index: int) -> None:
    shutil.copytree(out, copy)
    nb = nbformat.read(copy / notebook, as_version=4)
    tags = nb.cells[index].metadata["tags"]
    assert "raises-exception" in tags
    tags.remove("raises-exception")
    nbformat.write(nb, copy / notebook)


def test_a_broken_copy_of_the_edition_is_caught(edition, tmp_path):
    out, reports = edition
    notebook, report = next((name, r) for name, r in reports.items() if r.dependent)
    index = report.dependent[0]
    _untag(out, tmp_path / "dependent", notebook, index)
    problems = se.flow_problems(tmp_path / "dependent")
    assert problems and all(p.startswith(f"{notebook} cell ") for p in problems), problems
    assert index in _problem_cells(problems)
    # a check cell too
    nb = nbformat.read(out / notebook, as_version=4)
    check = next(i for i, c in enumerate(nb.cells) if "check" in c.metadata.get("tags", []))
    _untag(out, tmp_path / "check", notebook, check)
    assert any(f"cell {check} is a check cell" in p for p in se.flow_problems(tmp_path / "check"))


def test_check_flow_on_the_command_line(tmp_path, capsys, monkeypatch):
    root = _tiny_book(tmp_path, _exercise())
    assert se.main(["--root", str(root), "--out", "student", "--check-flow", "--quiet"]) == 0   # writes, then checks
    assert "✓ every cell not tagged raises-exception runs" in capsys.readouterr().out
    path = root / "student" / "chapters" / "01_one.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[-1].metadata["tags"] = ["check"]                  # the check cell, untagged
    nbformat.write(nb, path)
    monkeypatch.setattr(se.cli, "write_edition", lambda *args, **kwargs: {})    # check the broken edition as it is
    assert se.main(["--root", str(root), "--out", "student", "--check-flow"]) == 1
    assert "✗ chapters/01_one.ipynb cell" in capsys.readouterr().out


def test_names_a_cell_reads_and_binds():
    src = ("import numpy as np\ntotal = 0\nfor i in range(n):\n    total += i\n"
           "def g(a, *, b=default):\n    c = a + b + glob\n    return [c * k for k in ks]\n"
           "class K(Base):\n    z = 1\n    w = z + 1\n    def m(self):\n        return z\n"
           "acc += 1\ntry:\n    pass\nexcept ValueError as err:\n    print(err)\n")
    # not the functions' parameters and locals, nor the comprehension's k, nor the class body's own z (its
    # method's z is a global); i and err count, read by the statement that binds them (on the safe side)
    assert se.used_names(src) == {"range", "n", "default", "glob", "ks", "Base", "z", "acc", "print", "ValueError",
                                  "i", "err"}
    assert se.bound_names(src) == {"np", "total", "i", "g", "K", "acc", "err"}
    assert se.bound_names(src, imports=False) == se.bound_names(src) - {"np"}
    assert se.immediate_reads(src) == {"range", "n", "default", "Base", "print", "ValueError"}
    assert se.raising_functions(STUB_F + "\ndef h():\n    return 1") == {"f"}
    magic = 'if "google.colab" in sys.modules:\n    %pip install kvlib\nx = 1'
    assert se.bound_names(magic) == {"x"} and se.used_names(magic) == {"sys"}


# --- the YAML files are read as YAML --------------------------------------------------------------

def test_toc_and_config_are_read_with_a_yaml_library(tmp_path):
    root = _tiny_book(tmp_path, _exercise())
    # flow style, quoted keys and a comment: a line-by-line regex misreads all three
    (root / "_toc.yml").write_text('{format: jb-book, "root": chapters/index,  # the landing page\n'
                                   ' "chapters": [{file: "chapters/01_one.ipynb"}, {\'file\': chapters/instructors}]}\n')
    config = (root / "_config.yml").read_text()
    config = re.sub(r"(?m)^title:.*$", "title: 'It''s a book'", config)
    (root / "_config.yml").write_text(config)
    assert se.toc_entries(root) == ["chapters/index", "chapters/01_one", "chapters/instructors"]
    assert [p.name for _, p in se.notebooks_in_order(root)] == ["01_one.ipynb"]
    assert se.book_title(root) == "It's a book"
    se.write_edition(root, root / "student", quiet=True)
    toc = yaml.safe_load((root / "student" / "_toc.yml").read_text())
    assert toc["root"] == "chapters/index" and toc["chapters"] == [{"file": "chapters/01_one.ipynb"}]
    assert yaml.safe_load((root / "student" / "_config.yml").read_text())["title"] == "It's a book (student edition)"
    assert "It's a book: student edition" in (root / "student" / "README.md").read_text()


def test_a_toc_with_parts_and_sections_is_read_in_order(tmp_path):
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nparts:\n  - caption: One\n    chapters:\n    - file: a\n      sections:\n"
        "      - file: a1.md\n  - caption: Two\n    chapters:\n    - file: chapters/instructors\n    - file: b\n")
    assert se.toc_entries(tmp_path) == ["intro", "a", "a1", "chapters/instructors", "b"]
    toc = yaml.safe_load(se.student_toc(tmp_path))
    assert [c["file"] for c in toc["parts"][1]["chapters"]] == ["b"]
