"""The stored pages are one run on one machine, and their prose types no measured figure.

``book/runtimes.py`` reads when each stored notebook ran and which machine it names;
``book/prose_figures.py`` finds figures in markdown that no output of the page prints. Both
are checked on the committed pages, and each is shown failing on a planted defect."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book"))
import runtimes  # noqa: E402  (book/ is a folder of Sphinx extensions, not a package)

from book.prose_figures import typed_figures  # noqa: E402

PAGES = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
MACHINE = "This page's measurements: AMD EPYC (AVX2), 2 threads, torch 2.13.0+cpu, 2026-12-07\n"


def _page(tmp_path: Path, name: str, start: str, end: str, outputs: list[str], markdown: str = "") -> Path:
    cells = [{"cell_type": "markdown", "source": [markdown], "metadata": {}}]
    cells += [{"cell_type": "code", "source": ["x = 1"], "execution_count": i + 1, "metadata": {"execution": {
        "iopub.execute_input": start if i == 0 else end, "shell.execute_reply": end}},
        "outputs": [{"output_type": "stream", "name": "stdout", "text": [text]}]} for i, text in enumerate(outputs)]
    path = tmp_path / name
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_the_stored_pages_are_one_run_on_one_machine():
    problems = runtimes.run_problems(PAGES)
    assert not problems, "the stored pages are not one run on one machine (run `make notebooks`):\n" + "\n".join(problems)


def test_one_run_holds_for_pages_run_in_turn(tmp_path):
    pages = [_page(tmp_path, "01_a.ipynb", "2026-12-07T18:00:00Z", "2026-12-07T18:02:00Z", [MACHINE, "step 3.1 ms\n"]),
             _page(tmp_path, "02_b.ipynb", "2026-12-07T18:02:05Z", "2026-12-07T18:03:00Z", ["4 tokens\n"]),
             _page(tmp_path, "03_c.ipynb", "2026-12-07T18:03:04Z", "2026-12-07T18:05:00Z",
                   [MACHINE.replace("2 threads", "1 thread") + "12.0 tok/s\n"])]
    assert runtimes.run_problems(pages) == []
    assert runtimes.run_summary(pages) == "2026-12-07, 18:00 to 18:05 UTC (4 min 51 s of execution)"


@pytest.mark.parametrize("defect, expected", [
    ("one page run again later", "started +3600 s after 01_a.ipynb ended: not one run"),
    ("another machine", "the pages name 2 machines"),
    ("measured before naming the machine", "02_b.ipynb: cell 1 prints a measured figure before the page names"),
    ("another day", "02_b.ipynb names 2026-12-08, the run started on 2026-12-07"),
])
def test_one_run_fails_on_each_kind_of_mix(tmp_path, defect, expected):
    second = {"one page run again later": ("2026-12-07T19:02:00Z", [MACHINE]),
              "another machine": ("2026-12-07T18:02:05Z", [MACHINE.replace("AMD EPYC (AVX2)", "Apple M2 (NEON)")]),
              "measured before naming the machine": ("2026-12-07T18:02:05Z", ["41.0 tok/s\n", MACHINE]),
              "another day": ("2026-12-07T18:02:05Z", [MACHINE.replace("2026-12-07", "2026-12-08")])}[defect]
    pages = [_page(tmp_path, "01_a.ipynb", "2026-12-07T18:00:00Z", "2026-12-07T18:02:00Z", [MACHINE]),
             _page(tmp_path, "02_b.ipynb", second[0], second[0].replace(":0", ":1", 1), second[1])]
    assert any(expected in p for p in runtimes.run_problems(pages)), runtimes.run_problems(pages)


def test_no_page_types_a_measured_figure():
    found = [str(f) for page in PAGES for f in typed_figures(page)]
    assert not found, ("figures typed into the prose that no output of their page prints (print them from a cell, "
                       "or quote them with their source):\n" + "\n".join(found))


@pytest.mark.parametrize("markdown, typed", [
    ("A step took 12.3 ms here.", ["12.3 ms"]),                        # printed as 12.4 ms: another run's figure
    ("The panels were 1.9 times as fast, and 26 % ahead at 400 rows.", ["1.9 times", "26 %"]),
    ("Eight caches take 720 MiB beside the weights.", ["720 MiB"]),
    ("A step took 12.4 ms here, 2.5× faster.", []),                    # both printed by the page
    ("The course's reference figure is 8.85 s.", []),                  # quoted as the course's
    ("An H100 reads 3.35 TB/s ([datasheet](https://www.nvidia.com/h100)).", []),
    ("Its cache holds 4 tokens of 32 × 128 numbers: `12 ms` in code, $2\\times$ in math.", []),
])
def test_a_typed_figure_is_caught(tmp_path, markdown, typed):
    page = _page(tmp_path, "07_x.ipynb", "2026-12-07T18:00:00Z", "2026-12-07T18:01:00Z",
                 [MACHINE + "a step: 12.4 ms (2.5× faster)\n"], markdown)
    assert [f.figure for f in typed_figures(page)] == typed


MAX_WORDS = 300          # AUTHORING.md: a longer explanation is two cells with an output or a figure between


def test_no_markdown_cell_runs_past_300_words():
    long = []
    for page in PAGES:
        for index, cell in enumerate(json.loads(page.read_text(encoding="utf-8"))["cells"]):
            words = len("".join(cell["source"]).split())
            if cell["cell_type"] == "markdown" and words > MAX_WORDS:
                long.append(f"{page.name}, cell {index}: {words} words")
    assert not long, f"markdown cells over {MAX_WORDS} words (split them):\n" + "\n".join(long)
