"""Writing the edition: every page of ``_toc.yml`` but the instructors', the files beside them,
``_config.yml``, ``_toc.yml`` and a README for students."""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

from .base import INSTRUCTOR_ONLY, StudentEditionError
from .lint import consistency_problems
from .notebook import NotebookReport, student_notebook
from .toc import book_title, page_file, student_config, student_toc, toc_entries

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

The chapter's text and notebooks are under the Creative Commons Attribution 4.0 licence (CC BY 4.0,
in `LICENSE-text`); kvlib, the code they import, under Apache-2.0.
"""
# The licence of the text and notebooks, copied into the edition so that it travels with them.
TEXT_LICENCE = "LICENSE-text"


def _transformed(root: Path, pages: list[tuple[str, Path]]) -> tuple[dict, dict[str, NotebookReport]]:
    """The student version of every notebook among ``pages``, by path, and the reports, by name."""
    transformed, reports = {}, {}
    for _, path in pages:
        if path.suffix == ".ipynb":
            name = path.relative_to(root).as_posix()
            transformed[path], reports[name] = student_notebook(nbformat.read(path, as_version=4), name)
    return transformed, reports


def _copy_other_files(root: Path, out: Path, pages: list[tuple[str, Path]]) -> None:
    """The files next to the pages (images, data): everything but notebooks and instructor pages."""
    page_paths = {p.resolve() for _, p in pages}
    instructor_paths = {(root / e).with_suffix(s).resolve() for e in INSTRUCTOR_ONLY for s in (".md", ".ipynb")}
    for folder in {path.parent for _, path in pages}:
        for f in folder.rglob("*"):
            if (f.is_file() and f.suffix != ".ipynb" and f.resolve() not in page_paths
                    and f.resolve() not in instructor_paths and ".ipynb_checkpoints" not in f.parts
                    and not f.name.startswith(".")):
                target = out / f.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)


def _write_pages(root: Path, out: Path, pages: list[tuple[str, Path]], transformed: dict) -> None:
    for sub in {Path(entry).parts[0] for entry, _ in pages if len(Path(entry).parts) > 1}:
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    out.mkdir(parents=True, exist_ok=True)
    for _, path in pages:
        target = out / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path in transformed:
            nbformat.write(transformed[path], target)
        else:
            shutil.copy2(path, target)


def write_edition(root: Path, out: Path, *, quiet: bool = False) -> dict[str, NotebookReport]:
    """Write the student edition of the book at ``root`` into ``out``; return what was done per notebook."""
    root, out = root.resolve(), out.resolve()
    if out == root or root.is_relative_to(out):
        raise StudentEditionError(f"the student edition cannot be written over the book itself ({out})")
    pages = [(entry, page_file(root, entry)) for entry in toc_entries(root) if entry not in INSTRUCTOR_ONLY]
    # transform everything first, so that an error leaves the previous edition untouched
    transformed, reports = _transformed(root, pages)
    problems = consistency_problems(root)
    if problems:
        raise StudentEditionError("the exercises are not consistent:\n  " + "\n  ".join(problems))
    _write_pages(root, out, pages, transformed)
    _copy_other_files(root, out, pages)
    (out / "_config.yml").write_text(student_config(root, out), encoding="utf-8")
    (out / "_toc.yml").write_text(student_toc(root), encoding="utf-8")
    (out / "README.md").write_text(STUDENT_README.format(title=book_title(root)), encoding="utf-8")
    if (root / TEXT_LICENCE).is_file():
        shutil.copy2(root / TEXT_LICENCE, out / TEXT_LICENCE)
    if not quiet:
        for name, r in reports.items():
            print(f"  {name}: {r.stubs} stubs, {r.checks} checks, {len(r.dependent)} cells that use a "
                  f"solution cleared, {r.removed_markdown} solution cells removed")
        print(f"Student edition written to {out}")
    return reports
