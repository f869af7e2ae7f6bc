"""The instructors' page lists every exercise of the notebooks, as the notebooks have it.

The exercises are read from the notebooks' ``{exercise}`` directives (label, title, the kind
line's kind and difficulty, and whether a check cell follows); the page's table must have one
row for each, with the same number, title, kind, difficulty and grading, an estimate in
minutes, how its check grades, and a mistake its check names.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from book import student_edition as se

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "chapters" / "instructors.md"

EXERCISES = se.book_exercises(ROOT)
NOTEBOOKS = se.notebooks_in_order(ROOT)


COLUMNS = ("number", "label", "title", "kind", "difficulty", "graded", "minutes", "how", "mistake")
GRADED = {"code": "check", "question": "written"}         # a check cell follows, or a written solution only


def _table() -> dict[str, dict]:
    """The rows of the page's exercise table, by label."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(COLUMNS) and re.fullmatch(r"`ex-[a-z0-9]+-\d+`", cells[1]):
            row = dict(zip(COLUMNS, cells))
            label = row["label"].strip("`")
            assert label not in rows, f"{label} is listed twice"
            rows[label] = row
    return rows


def test_the_page_is_in_the_book_last():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert toc["chapters"][-1]["file"] == "chapters/instructors"


def test_the_page_has_a_table_of_exercises():
    assert len(_table()) >= 12


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.label)
def test_every_exercise_is_in_the_table_as_the_notebook_has_it(exercise):
    rows = _table()
    assert exercise.label in rows, f"{exercise.label} ({exercise.notebook}) is missing from {PAGE.name}'s table"
    row = rows[exercise.label]
    assert row["number"] == f"{exercise.section}.{exercise.number}"
    assert row["title"] == exercise.title
    assert row["kind"] == exercise.activity, f"{exercise.label} is {exercise.activity!r} in the notebook"
    stars = "★" * exercise.difficulty + "☆" * (3 - exercise.difficulty)
    assert row["difficulty"] == stars, f"{exercise.label} is {stars} in the notebook"
    assert row["graded"] == GRADED[exercise.kind], f"{exercise.label}: the notebook has a {exercise.kind} exercise"
    assert row["minutes"].isdigit() and 0 < int(row["minutes"]) <= 120
    assert len(row["how"]) > 10, f"{exercise.label}: say how its check grades"
    if exercise.kind == "code":
        assert len(row["mistake"]) > 10, f"{exercise.label}: name a mistake its check names"


def test_every_row_is_an_exercise_of_the_notebooks():
    """No row for an exercise that is gone, except for a section whose exercises are not in its
    notebook yet (then the row waits for them)."""
    labels = {e.label for e in EXERCISES}
    sections_with_exercises = {e.section for e in EXERCISES}
    for label, row in _table().items():
        if int(row["number"].split(".")[0]) in sections_with_exercises:
            assert label in labels, f"{PAGE.name} lists {label}, which no notebook has"


@pytest.mark.parametrize("section, path", NOTEBOOKS, ids=lambda x: getattr(x, "name", str(x)))
def test_every_section_ends_with_two_to_four_exercises(section, path):
    mine = [e for e in EXERCISES if e.section == section]
    assert 2 <= len(mine) <= 4, f"{path.name} has {len(mine)} exercises"
    assert [e.number for e in mine] == list(range(1, len(mine) + 1))
    assert any(e.kind == "code" for e in mine), f"{path.name}: no code exercise with a check"


def test_the_page_names_the_sections_it_describes():
    text = PAGE.read_text()
    for _, path in NOTEBOOKS:
        assert f"{{doc}}`{path.stem}`" in text, f"the learning objectives do not link {path.stem}"
