"""The student edition of the book: the same notebooks, without the solutions.

    python -m book.student_edition [--out student]         # write the edition
    python -m book.student_edition --check                  # only the consistency check
    python -m book.student_edition --out student --leaks    # after a build: scan it for solution text
    python -m book.student_edition --out student --check-flow
        # write it, then check (statically) that every cell not tagged raises-exception runs with the stubs

Reads every page of ``_toc.yml`` in order and writes ``<out>/chapters/*.ipynb``:

- a code cell tagged ``solution`` becomes its stub (``cell.metadata["stub"]``; a solution
  cell without one is an error), outputs cleared;
- a ``{solution-start}`` … ``{solution-end}`` block (the markdown cells, or parts of cells,
  from the one to the other) and every ``{solution}`` directive are removed;
- a cell tagged ``check`` keeps its code, loses its outputs and is tagged
  ``raises-exception``: on a stub it raises ``CheckFailed``;
- by the transitive name flow (:mod:`.flow`), every cell that raises with the stubs in place
  is tagged ``raises-exception``: a stub that raises at its top level (a ``def`` whose body
  raises does not, but calling it does), and a later cell that uses a name a stub, a
  solution or such a raising cell bound (say, it calls the student's function to compare it
  with a measurement, or uses what such a cell computed); the latter lose their outputs too.
  Every other cell keeps its stored outputs, so nbval still compares them.

It also copies the other pages of ``_toc.yml`` (``chapters/index.md``, …) and the other
files of ``chapters/`` (images), leaves out the pages meant for instructors, and writes
``<out>/_config.yml`` and ``<out>/_toc.yml`` (read and written with PyYAML) so that
``jupyter-book build <out>`` builds the edition, and a short ``<out>/README.md`` for students.

Before writing anything it checks that the exercises are consistent (no kvlib needed): each
exercise has a solution, each code exercise a check cell that calls ``check_*`` on the
solution's function, each stub names its exercise ("Exercise 3.2"), labels are numbered
in order. Any problem stops it with a message.

Modules: ``toc`` (``_toc.yml``, ``_config.yml``), ``markdown`` (solution directives),
``names`` (what a cell binds and reads), ``flow`` (the name flow), ``notebook`` (one notebook),
``exercises`` and ``lint`` (the consistency check), ``edition`` (writing), ``leaks`` (the scan
of a build), ``flowcheck`` (``--check-flow``), ``cli``. Only PyYAML and nbformat.
"""
from __future__ import annotations

from .base import INSTRUCTOR_ONLY, RAISES, ROOT, StudentEditionError
from .cli import main
from .edition import STUDENT_README, write_edition
from .exercises import ACTIVITIES, KIND_LINE, Exercise, book_exercises
from .flow import CellFlow, FlowCell, Taint, trace
from .flowcheck import FlowReport, check_flow, flow_problems
from .leaks import find_leaks, solution_fragments
from .lint import consistency_problems, exercise_counts
from .markdown import MarkdownSplit, split_markdown
from .names import bound_names, defined_functions, immediate_reads, raising_functions, stub_raises, used_names
from .notebook import NotebookReport, student_notebook
from .toc import book_title, notebooks_in_order, page_file, student_config, student_toc, toc_entries

__all__ = [
    "ACTIVITIES", "INSTRUCTOR_ONLY", "KIND_LINE", "RAISES", "ROOT", "STUDENT_README",
    "CellFlow", "Exercise", "FlowCell", "FlowReport", "MarkdownSplit", "NotebookReport", "StudentEditionError", "Taint",
    "book_exercises", "book_title", "bound_names", "check_flow", "consistency_problems", "defined_functions",
    "exercise_counts", "find_leaks", "flow_problems", "immediate_reads", "main", "notebooks_in_order", "page_file",
    "raising_functions", "solution_fragments", "split_markdown", "stub_raises", "student_config", "student_notebook",
    "student_toc", "toc_entries", "trace", "used_names", "write_edition",
]
