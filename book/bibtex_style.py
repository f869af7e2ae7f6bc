"""A Sphinx extension: the chapter's citations in round brackets.

sphinxcontrib-bibtex's ``author_year`` style writes ``{cite:p}`key``` as "[Leviathan et al., 2023]"
and ``{cite:t}`key``` as "Leviathan et al. [2023]". This registers ``author_year_round``, the
same style with round brackets, "(Leviathan et al., 2023)" and "Leviathan et al. (2023)", as
the chapter's text wrote its citations before they became links. ``_config.yml`` lists it under
``sphinx: local_extensions`` and names it in ``bibtex_reference_style``; the sources are in
``chapters/references.bib``, listed on ``chapters/references.md``.
"""
from __future__ import annotations

import dataclasses

import sphinxcontrib.bibtex.plugin
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

NAME = "author_year_round"


def _round() -> BracketStyle:
    return BracketStyle(left="(", right=")")


@dataclasses.dataclass
class RoundAuthorYearReferenceStyle(AuthorYearReferenceStyle):
    """``author_year`` with round brackets for every kind of citation."""

    bracket_parenthetical: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_textual: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_author: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_label: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_year: BracketStyle = dataclasses.field(default_factory=_round)


sphinxcontrib.bibtex.plugin.register_plugin("sphinxcontrib.bibtex.style.referencing", NAME,
                                            RoundAuthorYearReferenceStyle)


def setup(app) -> dict:
    return {"parallel_read_safe": True, "parallel_write_safe": True}
