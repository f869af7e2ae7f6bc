"""Measured figures typed into a page's prose: the check behind "no typed measurement".

A markdown cell may state a figure with a unit of measurement (``12.3 ms``, ``41 tok/s``,
``1.9×``, ``26 %``, ``513 MiB``, ...) only where an output of the same page prints it, so
that the sentence and the output beside it are one run's; or where the figure is quoted with
its source right beside it (a ``{cite}`` role or a link within the sentence, after the
figure), or is named as the course's reference figure. Anything else is a number someone
typed while looking at one machine's run, which the next run contradicts.

``python -m book.prose_figures chapters/*.ipynb`` lists the offenders (exit status 1 when
there are any); ``tests/book_build/test_prose_figures.py`` runs the same check on every
stored page and shows it failing on a planted figure.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# The units of a measured figure. "s" and "min" need a space before them ("5 s"), so that
# "1990s" is no time; "x" none ("2x"), so that "2 x 3" is no ratio.
_UNITS = (r"ns|µs|us|ms|min|s|tok/s|tokens/s|GB/s|MB/s|TB/s|GiB/s|GFLOP/s|TFLOP/s|FLOP/s"
          r"|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB|×|%")
_FIGURE = re.compile(
    r"(?<![\w.\-/^])(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    r"(?:(?P<space>[ \u00a0\u202f])(?P<spaced>" + _UNITS + r")|(?P<glued>×|%|x|GB|MB|KiB|MiB|GiB|ms))"
    r"(?![\w/])")
_TIMES_WORD = re.compile(r"(?<![\w.,])(?P<number>\d{1,3}(?:,\d{3})*\.\d+) times\b")      # "1.9 times as fast"
_SOURCE = re.compile(r"\{cite[:a-z]*\}|\]\((?:https?:|\.\./|[\w./-]+\.(?:md|ipynb|pdf))")
_COURSE = re.compile(r"reference figure|the course's|the article's|datasheet", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?:;])\s+(?=[A-Z*(`])|\n\s*\n|\n\s*[-*|] ")


@dataclass(frozen=True)
class TypedFigure:
    """A figure in a markdown cell that no output of its page prints, with its sentence."""

    page: str
    cell: int
    figure: str
    sentence: str

    def __str__(self) -> str:
        return f"{self.page}, cell {self.cell}: {self.figure!r} in: {self.sentence}"


def _prose(source: str) -> str:
    """The markdown without what is not prose: fenced code, inline code, math, HTML comments,
    and MyST directives' option lines."""
    source = re.sub(r"(?ms)^(`{3,}|~{3,})[^\n]*\n.*?^\1\s*$", " ", source)
    source = re.sub(r"(?s)<!--.*?-->", " ", source)
    source = re.sub(r"(?s)\$\$.*?\$\$", " ", source)
    source = re.sub(r"\$[^$\n]+\$", " ", source)
    source = re.sub(r"``[^`]+``|`[^`\n]+`", " ", source)
    return re.sub(r"(?m)^:[\w-]+:.*$", " ", source)


def _printed(figure: re.Match, outputs: str) -> bool:
    """Whether the page's outputs print this number with this unit (spaces may differ;
    "1.9 times" is printed as "1.9×")."""
    number = re.escape(figure["number"])
    unit = figure.groupdict().get("spaced") or figure.groupdict().get("glued") or "×"
    unit = "(?:×|x)" if unit in ("×", "x") else re.escape(unit)
    return re.search(rf"(?<![\w.]){number}\s?{unit}", outputs) is not None


def _quoted(sentence: str, offset: int) -> bool:
    """Whether the figure at ``offset`` of ``sentence`` is quoted with its source: a citation or
    a link after it in the same sentence, or the sentence names it the course's figure."""
    return bool(_SOURCE.search(sentence, offset) or _COURSE.search(sentence))


def _sentences(text: str) -> list[tuple[int, str]]:
    """``(start, sentence)`` for each sentence of ``text``."""
    out, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        out.append((start, text[start:end.start()]))
        start = end.end()
    out.append((start, text[start:]))
    return out


def _outputs(cells: list[dict]) -> str:
    texts = []
    for cell in cells:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            texts.append("".join(output.get("text", "")))
            texts += ["".join(v) for k, v in output.get("data", {}).items() if k.startswith("text/")]
    return "\n".join(texts)


def typed_figures(path: Path) -> list[TypedFigure]:
    """Every figure with a unit in the markdown of the notebook at ``path`` that none of its
    outputs prints and that is not quoted with its source."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    outputs = _outputs(cells)
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        for start, sentence in _sentences(_prose("".join(cell["source"]))):
            figures = sorted([*_FIGURE.finditer(sentence), *_TIMES_WORD.finditer(sentence)], key=lambda m: m.start())
            for figure in figures:
                if figure.group(0).endswith(("×", "x")) and re.match(r"\s?\d", sentence[figure.end():]):
                    continue                                   # "32 × 128": a product, not a ratio
                if _printed(figure, outputs) or _quoted(sentence, figure.end()):
                    continue
                found.append(TypedFigure(path.name, index, figure.group(0), " ".join(sentence.split())))
    return found


def main(argv: list[str]) -> int:
    found = [f for arg in argv for f in typed_figures(Path(arg))]
    for figure in found:
        print(figure)
    print(f"{len(found)} typed figure(s) that no output of their page prints")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
