"""The first code cell of every notebook: on Colab it installs kvlib; elsewhere it checks kvlib is there.

The book's launch buttons open a notebook of this repository on Colab, where kvlib is not
installed. So every notebook's first code cell installs it there, with what the notebooks
need (``kvlib[notebooks]``), from the repository and the git ref that ``_config.yml`` names
(``repository.url`` and ``repository.kvlib_ref``): the one place that says where kvlib comes
from. Everywhere else (a ``make`` checkout, a ``pip install``, Binder, nbval, the book's
build) kvlib is installed and the cell prints nothing; a notebook downloaded alone and opened
where kvlib is missing prints the one line that installs it and stops with a short error,
instead of a bare ``ModuleNotFoundError`` a few cells later. The book's pages leave the cell
out (its ``remove-cell`` tag).

    python -m book.colab            # write (or update) the cell in every notebook of _toc.yml
    python -m book.colab --check    # exit 1, saying which, if a notebook lacks it or holds another

A notebook that gains the cell must be executed again (``make notebooks``): the cell is
written without outputs and without an execution count, which the tests catch.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CELL_ID = "colab-install"
TAGS = ["remove-cell"]

TEMPLATE = '''\
# On Colab, install kvlib (this chapter's code) and what the notebooks need. Elsewhere (a `make`
# checkout, a kvlib wheel, Binder) kvlib is there and this cell does nothing; where it is missing,
# the cell prints the line that installs it.
import sys

try:
    import kvlib  # noqa: F401
except ModuleNotFoundError as missing:
    if "google.colab" in sys.modules:
        %pip install --quiet "kvlib[notebooks] @ git+{url}@{ref}"
    elif missing.name == "kvlib":
        print('kvlib is not installed here; install it with: pip install "kvlib[notebooks] @ git+{url}@{ref}"')
        raise ModuleNotFoundError("kvlib is missing: run the pip line above, restart the kernel, run again") from None
    else:
        raise
if "google.colab" in sys.modules:
    from google.colab import output
    output.enable_custom_widget_manager()       # Colab shows ipywidgets 8's widgets only with this'''


def install_source(root: Path = ROOT) -> str:
    """The cell's source for the repository and ref that ``root/_config.yml`` names."""
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    repo = config.get("repository") or {}
    url, ref = repo.get("url"), repo.get("kvlib_ref")
    if not url or not ref:
        raise ValueError("_config.yml must name repository.url and repository.kvlib_ref (the git ref that "
                         "Colab installs kvlib from)")
    return TEMPLATE.format(url=url.rstrip("/"), ref=ref)


def notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks of the book, in ``_toc.yml`` order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    files = [entry["file"] for entry in toc.get("chapters", []) if "file" in entry]
    return [root / f"{f}.ipynb" for f in files if (root / f"{f}.ipynb").exists()]


def first_code_cell(nb: dict) -> dict | None:
    return next((c for c in nb["cells"] if c["cell_type"] == "code"), None)


def problem(path: Path, source: str) -> str | None:
    """Why the notebook at ``path`` does not open with the install cell ``source``, or ``None``."""
    cell = first_code_cell(json.loads(path.read_text(encoding="utf-8")))
    if cell is None or cell.get("id") != CELL_ID:
        return f"{path.name}: its first code cell is not the Colab install cell (run `python -m book.colab`)"
    if "".join(cell["source"]) != source:
        return f"{path.name}: the Colab install cell differs from _config.yml's (run `python -m book.colab`)"
    if cell.get("metadata", {}).get("tags") != TAGS:
        return f"{path.name}: the Colab install cell must be tagged {TAGS} and nothing else"
    return None


def write(path: Path, source: str) -> bool:
    """Put the install cell first among the code cells of ``path`` (after the opening markdown);
    True if the file changed. A new cell has no outputs and no count: execute the notebook again."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = next((c for c in nb["cells"] if c.get("id") == CELL_ID), None)
    if cell is None:
        cell = {"cell_type": "code", "execution_count": None, "id": CELL_ID, "metadata": {}, "outputs": []}
        first_markdown = 1 if nb["cells"] and nb["cells"][0]["cell_type"] == "markdown" else 0
        nb["cells"].insert(first_markdown, cell)
    lines = source.splitlines(keepends=True)
    changed = cell.get("source") != lines or cell["metadata"].get("tags") != TAGS
    cell["source"], cell["metadata"]["tags"] = lines, list(TAGS)
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a notebook needs the cell")
    args = parser.parse_args(argv)
    source = install_source()
    if args.check:
        problems = [p for p in (problem(path, source) for path in notebooks()) if p]
        print("\n".join(problems) or f"every notebook opens with the Colab install cell ({len(notebooks())})")
        return 1 if problems else 0
    for path in notebooks():
        if write(path, source):
            print(f"wrote the Colab install cell into {path.relative_to(ROOT)}: execute it again (make notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
