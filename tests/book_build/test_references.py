"""The chapter cites its sources the Jupyter Book way (sphinxcontrib-bibtex): every paper,
specification and datasheet it names is an entry of ``chapters/references.bib`` with a link (a
DOI, an arXiv id or a URL), listed on ``chapters/references.md``; the text cites them with
``{cite:p}`key``` and its kin, never as plain "(Author et al., 2023)".

Every page of the book is checked, the notebooks' markdown cells and the ``.md`` pages alike:
a plain citation in any of them fails here, with the page, the cell and the text to convert."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pybtex.database
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"
BIB = CHAPTERS / "references.bib"
PAGES = sorted([*CHAPTERS.glob("*.ipynb"), *CHAPTERS.glob("*.md")])

# {cite}`a`, {cite:p}`a,b`, {cite:t}`a`, {cite:alp}`a`, {cite:year}`a`, ...
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
# "(Xiao et al., 2023)", "Leviathan et al. (2023)", "(Shazeer, 2019)", "(Williams, Waterman and Patterson, 2009)"
PLAIN = [re.compile(r"\bet al\.?,?\s*\(?(?:19|20)\d\d\b"),
         re.compile(r"\b[A-Z][a-zA-Z-]+(?:,| and) (?:[A-Z][a-zA-Z-]+(?:,| and) )*(?:19|20)\d\d\)")]
ARXIV_ID = re.compile(r"\d{4}\.\d{4,5}")


def _entries() -> dict:
    return pybtex.database.parse_file(str(BIB)).entries


def _markdown(path: Path) -> list[tuple[str, str]]:
    """(where, text) of every markdown cell of a notebook, or of the whole page of a .md file."""
    if path.suffix == ".md":
        return [(path.name, path.read_text(encoding="utf-8"))]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [(f"{path.name}, cell {i}", "".join(c["source"]))
            for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


def test_every_entry_has_a_link():
    """A DOI, an arXiv id or a URL: pybtex's style renders each as a link."""
    entries = _entries()
    assert len(entries) >= 30
    for key, entry in entries.items():
        fields = {k.lower(): v for k, v in entry.fields.items()}
        assert fields.keys() & {"doi", "eprint", "url"}, f"{key}: no doi, eprint or url"
        if "doi" in fields:
            assert fields["doi"].startswith("10."), f"{key}: doi {fields['doi']!r} is not a DOI"
        if "eprint" in fields:
            assert ARXIV_ID.fullmatch(fields["eprint"]), f"{key}: eprint {fields['eprint']!r} is not an arXiv id"
        if "url" in fields:
            assert fields["url"].startswith("https://"), f"{key}: url {fields['url']!r}"
        assert fields.get("year", "").isdigit(), f"{key}: the author-year citations need a year"


def test_keys_follow_the_convention_and_the_list_at_the_top():
    """Lower-case keys (first author, year, first word), all listed in the comment at the top of the
    file, where the chapter's authors look them up."""
    entries = _entries()
    for key in entries:
        assert re.fullmatch(r"[a-z]+\d{4}[a-z0-9]+", key), f"{key}: not firstauthorYEARfirstword in lower case"
    header = "".join(line for line in BIB.read_text(encoding="utf-8").splitlines(keepends=True) if line.startswith("%"))
    listed = set(re.findall(r"\b[a-z]+\d{4}[a-z0-9]+\b", header))
    assert listed == set(entries), (f"keys missing from the list at the top: {sorted(set(entries) - listed)}; "
                                    f"listed but not entries: {sorted(listed - set(entries))}")


def test_the_book_builds_its_bibliography():
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert config["bibtex_bibfiles"] == ["chapters/references.bib"]
    assert config["sphinx"]["config"]["bibtex_reference_style"] == "author_year_round"
    assert config["sphinx"]["local_extensions"]["bibtex_style"] == "book/"
    toc = [c["file"] for c in yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))["chapters"]]
    assert toc.index("chapters/references") == toc.index("chapters/formulas") + 1
    assert toc.index("chapters/references") < toc.index("chapters/appendix_benchmark")
    page = (CHAPTERS / "references.md").read_text(encoding="utf-8")
    assert "```{bibliography}\n:all:\n```" in page


def test_the_round_bracket_style_is_registered():
    import sphinxcontrib.bibtex.plugin

    import book.bibtex_style as style

    found = sphinxcontrib.bibtex.plugin.find_plugin("sphinxcontrib.bibtex.style.referencing", style.NAME)
    brackets = found()
    assert (brackets.bracket_parenthetical.left, brackets.bracket_textual.right) == ("(", ")")


def test_every_cited_key_is_an_entry():
    entries = set(_entries())
    cited = {}
    for path in PAGES:
        for where, text in _markdown(path):
            for keys in CITE.findall(text):
                for key in (k.strip() for k in keys.split(",")):
                    cited.setdefault(key, where)
    assert cited, "no {cite} role anywhere in chapters/"
    unknown = {k: w for k, w in cited.items() if k not in entries}
    assert not unknown, f"cited but not in chapters/references.bib: {unknown}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_plain_citation_is_left(path):
    """"(Xiao et al., 2023)" is a {cite:p}`xiao2023efficient`, "Leviathan et al. (2023)" a
    {cite:t}`leviathan2023fast` (keys: the top of chapters/references.bib)."""
    found = [f"{where}: {m.group(0)!r}" for where, text in _markdown(path) for rx in PLAIN
             for m in rx.finditer(CITE.sub("", text))]
    assert not found, "plain citations, to write with {cite:p} / {cite:t} and a key of chapters/references.bib:\n" + \
        "\n".join(found)
