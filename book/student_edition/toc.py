"""The book around the notebooks: ``_toc.yml`` and ``_config.yml``, read and written with PyYAML."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import yaml

from .base import INSTRUCTOR_ONLY, ROOT, StudentEditionError

# The keys of _toc.yml that hold lists of entries (jb-book and jb-article formats).
_NESTED = ("parts", "chapters", "sections")
# Keys of sphinx: config: that need the offline assets the main book's build fetches.
_ASSET_KEYS = ("html_extra_path", "mathjax_path", "nb_ipywidgets_js")


def read_yaml(path: Path) -> dict:
    """The mapping in the YAML file at ``path``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise StudentEditionError(f"{path.name} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise StudentEditionError(f"{path.name} does not hold a YAML mapping")
    return data


def _page(entry: str) -> str:
    return re.sub(r"\.(ipynb|md)$", "", str(entry))


def _toc_files(node) -> Iterator[str]:
    """The ``file:`` entries under ``node`` of a table of contents, in order."""
    if isinstance(node, list):
        for item in node:
            yield from _toc_files(item)
    elif isinstance(node, dict):
        if "file" in node:
            yield _page(node["file"])
        for key in _NESTED:
            yield from _toc_files(node.get(key))


def toc_entries(root: Path = ROOT) -> list[str]:
    """The pages of ``_toc.yml`` in order (root first), as paths without a suffix."""
    toc = read_yaml(root / "_toc.yml")
    entries = [_page(toc["root"])] if toc.get("root") else []
    for key in _NESTED:
        entries.extend(_toc_files(toc.get(key)))
    return entries


def page_file(root: Path, entry: str) -> Path:
    """The file of the page ``entry`` of ``_toc.yml`` (a notebook, or else a markdown page)."""
    for suffix in (".ipynb", ".md"):
        if (root / (entry + suffix)).exists():
            return root / (entry + suffix)
    raise StudentEditionError(f"_toc.yml lists {entry!r}, but neither {entry}.ipynb nor {entry}.md exists")


def notebooks_in_order(root: Path = ROOT) -> list[tuple[int, Path]]:
    """``(section number, path)`` of every notebook of the book, in ``_toc.yml`` order.

    The root page is not numbered; the chapters after it are sections 1, 2, … in order.
    """
    out = []
    for number, entry in enumerate(toc_entries(root)):
        path = page_file(root, entry)
        if path.suffix == ".ipynb":
            out.append((number, path))
    return out


def book_title(root: Path) -> str:
    title = read_yaml(root / "_config.yml").get("title")
    return str(title).strip() if title else "The book"


def _dump(header: str, data: dict) -> str:
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def student_config(root: Path, out: Path) -> str:
    """``_config.yml`` for the student edition: the book's, adjusted to be built from ``out``."""
    config = read_yaml(root / "_config.yml")
    rel = Path(os.path.relpath(root, out)).as_posix()

    def to_root(path: str) -> str:
        return path if os.path.isabs(path) else f"{rel}/{path}"

    config["title"] = f"{book_title(root)} (student edition)"
    # students run the notebooks themselves; the repository holds the solutions
    for section, key, value in (("execute", "execute_notebooks", "off"), ("html", "use_repository_button", False)):
        config[section] = {**(config.get(section) or {}), key: value}
    # Launch buttons would open the instructors' notebooks, solutions and all: none here.
    config.pop("launch_buttons", None)
    sphinx = config.get("sphinx") or {}
    extensions = sphinx.get("local_extensions") or {}
    for name, folder in extensions.items():                        # name: folder, from the book's root
        extensions[name] = to_root(str(folder))
    settings = sphinx.get("config") or {}
    if "html_extra_path" in settings:
        paths = settings["html_extra_path"]
        paths = [to_root(str(p)) for p in ([paths] if isinstance(paths, str) else paths)]
        settings["html_extra_path"] = paths
        # The offline assets (widgets, MathJax) are served from the main book's build folder; where
        # they have not been fetched, keep the CDN defaults (as the Makefile does for the main book).
        if not all((out / p).is_dir() for p in paths):
            for key in _ASSET_KEYS:
                settings.pop(key, None)
    return _dump("# The student edition, written by `python -m book.student_edition` from the book's "
                 "_config.yml:\n# do not edit (run `make student` again).\n", config)


def _without_instructor_pages(node):
    if isinstance(node, list):
        return [_without_instructor_pages(item) for item in node
                if not (isinstance(item, dict) and _page(item.get("file", "")) in INSTRUCTOR_ONLY)]
    if isinstance(node, dict):
        return {key: _without_instructor_pages(value) if key in _NESTED else value for key, value in node.items()}
    return node


def student_toc(root: Path) -> str:
    """``_toc.yml`` for the student edition: the book's, without the pages for instructors."""
    toc = _without_instructor_pages(read_yaml(root / "_toc.yml"))
    return _dump("# The student edition's table of contents (python -m book.student_edition): do not edit.\n", toc)
