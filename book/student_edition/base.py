"""What every part of the student edition shares: where the book is, the tags, the error."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Pages for instructors only: left out of the student edition and its table of contents.
INSTRUCTOR_ONLY = ("chapters/instructors",)
RAISES = "raises-exception"

# The opening line of a MyST directive: ```{name} rest, or :::{name} rest.
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<name>[\w-]+)\}(?P<rest>.*)$")


class StudentEditionError(Exception):
    """The book cannot be turned into a student edition as it stands (the message says why)."""


def cell_tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def set_tags(cell, tags: list[str]) -> None:
    tags = list(dict.fromkeys(tags))
    if tags:
        cell.metadata["tags"] = tags
    else:
        cell.metadata.pop("tags", None)
