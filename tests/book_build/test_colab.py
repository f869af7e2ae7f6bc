"""Every notebook opens with the Colab install cell (book/colab.py): it installs kvlib on Colab
when kvlib is missing, from the repository and ref that _config.yml names; anywhere else it does
nothing when kvlib is there and prints the line that installs it when it is not."""
from __future__ import annotations

import builtins
import json
import sys
import types
from pathlib import Path

import pytest
import yaml
from IPython.core.inputtransformer2 import TransformerManager

import kvlib
from book import colab

ROOT = Path(__file__).resolve().parents[2]


def test_every_notebook_opens_with_the_install_cell():
    notebooks = colab.notebooks()
    assert len(notebooks) >= 8
    problems = [p for p in (colab.problem(path, colab.install_source()) for path in notebooks) if p]
    assert not problems, "\n".join(problems)


def test_every_notebook_of_the_chapters_folder_is_in_the_book():
    """A notebook left out of _toc.yml would escape the check above."""
    assert sorted(colab.notebooks()) == sorted(ROOT.glob("chapters/*.ipynb"))


def test_the_ref_is_the_release_tag_of_this_version():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["repository"]["kvlib_ref"] == f"v{kvlib.__version__}", \
        "bump repository.kvlib_ref in _config.yml with kvlib's version, then run python -m book.colab"


def _run_cell(monkeypatch, *, on_colab: bool, kvlib_installed: bool,
              missing: str = "kvlib") -> list[tuple[str, str]]:
    """Run the cell as IPython would (magics transformed); return the magics it called. Without
    kvlib, ``import kvlib`` raises ModuleNotFoundError for ``missing`` (kvlib itself, or a
    dependency of it)."""
    calls: list[tuple[str, str]] = []
    shell = types.SimpleNamespace(run_line_magic=lambda name, line: calls.append((name, line)))
    if on_colab:
        fake = types.ModuleType("google.colab")
        fake.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: calls.append(("widgets", "")))
        monkeypatch.setitem(sys.modules, "google.colab", fake)
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if not kvlib_installed:
        real_import = builtins.__import__

        def no_kvlib(name, *args, **kwargs):
            if name == "kvlib":
                raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", no_kvlib)
    code = TransformerManager().transform_cell(colab.install_source())
    exec(compile(code, "<colab cell>", "exec"), {"get_ipython": lambda: shell})
    return calls


def _install_line() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    return f'pip install "kvlib[notebooks] @ git+{config["url"]}@{config["kvlib_ref"]}"'


def test_off_colab_with_kvlib_the_cell_does_nothing(monkeypatch, capsys):
    assert _run_cell(monkeypatch, on_colab=False, kvlib_installed=True) == []
    assert capsys.readouterr().out == ""


def test_off_colab_without_kvlib_the_cell_prints_how_to_install_it_and_stops(monkeypatch, capsys):
    """A notebook downloaded alone: one line that says how to install kvlib, then a short error
    (so "Run all" stops here, not at a bare ModuleNotFoundError further down); it installs nothing."""
    calls = []
    with pytest.raises(ModuleNotFoundError, match="kvlib is missing: run the pip line above") as err:
        calls = _run_cell(monkeypatch, on_colab=False, kvlib_installed=False)
    assert calls == [] and err.value.__cause__ is None and err.value.__suppress_context__
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.rstrip("\n").endswith(_install_line())


def test_off_colab_a_missing_dependency_of_kvlib_is_not_reported_as_kvlib(monkeypatch, capsys):
    with pytest.raises(ModuleNotFoundError, match="No module named 'torch'"):
        _run_cell(monkeypatch, on_colab=False, kvlib_installed=False, missing="torch")
    assert capsys.readouterr().out == ""


def test_on_colab_with_kvlib_the_cell_only_turns_the_widgets_on(monkeypatch):
    assert _run_cell(monkeypatch, on_colab=True, kvlib_installed=True) == [("widgets", "")]


@pytest.mark.parametrize("missing", ["kvlib", "torch"])
def test_on_colab_without_kvlib_the_cell_installs_it_from_the_configured_ref(monkeypatch, missing):
    calls = _run_cell(monkeypatch, on_colab=True, kvlib_installed=False, missing=missing)
    assert calls == [("pip", _install_line().replace("pip install ", "install --quiet ", 1)), ("widgets", "")]


def test_the_notebooks_extra_exists():
    """The cell installs kvlib[notebooks]: pyproject.toml must declare that extra."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "notebooks" in project.get("optional-dependencies", {})


def test_write_inserts_the_cell_once_without_outputs(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": ["# Title"]},
                    {"cell_type": "code", "id": "c", "metadata": {}, "source": ["x = 1"], "outputs": [],
                     "execution_count": 1}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps(nb))
    source = colab.install_source()
    assert colab.problem(path, source) is not None
    assert colab.write(path, source) and not colab.write(path, source)      # the second write changes nothing
    cells = json.loads(path.read_text())["cells"]
    assert [c["id"] for c in cells] == ["t", colab.CELL_ID, "c"]
    assert cells[1]["execution_count"] is None and cells[1]["outputs"] == []
    assert colab.problem(path, source) is None


def test_a_stale_ref_is_caught(tmp_path):
    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    colab.write(path, colab.install_source().replace("@v", "@old-v"))
    assert "differs from _config.yml" in colab.problem(path, colab.install_source())


@pytest.mark.parametrize("missing", ["url", "kvlib_ref"])
def test_the_config_must_name_url_and_ref(tmp_path, missing):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    del config["repository"][missing]
    (tmp_path / "_config.yml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="repository.url and repository.kvlib_ref"):
        colab.install_source(tmp_path)
