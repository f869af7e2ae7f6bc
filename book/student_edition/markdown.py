"""Markdown cells: find and remove the solution directives."""
from __future__ import annotations

from dataclasses import dataclass

from .base import FENCE, StudentEditionError


def closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes a directive opened with ``fence``."""
    s = line.strip()
    return len(s) >= len(fence) and set(s) == {fence[0]}


def directive_end(lines: list[str], start: int, fence: str) -> int:
    """Index of the line that closes the directive opened at ``lines[start]`` (or the last line)."""
    for j in range(start + 1, len(lines)):
        if closes(lines[j], fence):
            return j
    return len(lines) - 1


@dataclass
class MarkdownSplit:
    kept: str                  # the text a student sees
    solution: list[str]        # the solution text that was removed
    in_block: bool             # a {solution-start} block is still open at the end of the cell


def _in_block_line(lines: list[str], i: int, where: str) -> tuple[int, bool]:
    """Inside an open ``{solution-start}`` block: (the next line's index, whether the block is still open)."""
    m = FENCE.match(lines[i])
    name = m.group("name") if m else None
    if name == "solution-end":
        return directive_end(lines, i, m.group("fence")) + 1, False
    if name in ("solution-start", "solution", "exercise", "exercise-start"):
        raise StudentEditionError(f"{where}: a {{{name}}} inside an open {{solution-start}} block "
                                  f"(a {{solution-end}} is missing)")
    return i + 1, True


def split_markdown(text: str, in_block: bool, where: str = "") -> MarkdownSplit:
    """Remove ``{solution}`` directives and ``{solution-start}`` … ``{solution-end}`` blocks.

    ``in_block`` says whether a ``{solution-start}`` block opened in an earlier cell is still
    open; the result says whether it still is at the end of this one.
    """
    lines = text.splitlines()
    kept: list[str] = []
    solution: list[str] = []
    i = 0
    while i < len(lines):
        if in_block:
            nxt, in_block = _in_block_line(lines, i, where)
            if in_block:
                solution.append(lines[i])
            i = nxt
            continue
        m = FENCE.match(lines[i])
        name = m.group("name") if m else None
        if name == "solution-start":
            i = directive_end(lines, i, m.group("fence")) + 1
            in_block = True
        elif name == "solution":
            end = directive_end(lines, i, m.group("fence"))
            solution.extend(lines[i + 1:end])
            i = end + 1
        elif name == "solution-end":
            raise StudentEditionError(f"{where}: {{solution-end}} without a {{solution-start}} before it")
        else:
            kept.append(lines[i])
            i += 1
    return MarkdownSplit("\n".join(kept).strip("\n"), solution, in_block)
