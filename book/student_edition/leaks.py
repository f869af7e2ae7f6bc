"""The leak scan: no line of any solution in the written edition or its build."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Iterator

import nbformat

from .base import ROOT
from .notebook import student_notebook
from .toc import notebooks_in_order


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


def json_strings(x) -> Iterator[str]:
    """Every string in a JSON value, at any depth."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from json_strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from json_strings(v)


def searchable_texts(path: Path) -> list[str]:
    """A file's text, and the forms its content takes once decoded (JSON strings, HTML text)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []
    texts = [raw]
    if path.suffix in (".ipynb", ".json"):
        try:
            texts.append("\n".join(json_strings(json.loads(raw))))
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
        texts = searchable_texts(f)
        if not texts:
            continue
        for nb, lines in fragments.items():
            for line in lines:
                if any(line in t for t in texts):
                    leaks.append(f"{f.relative_to(out)}: {line!r} (from a solution in {nb})")
    return leaks
