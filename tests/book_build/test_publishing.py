"""The files that say who may use the chapter, how to cite it and what changed agree with each
other: pyproject.toml (licence, authors, URLs, version), LICENSE and LICENSE-text, CITATION.cff,
CHANGELOG.md, README.md's licence table and the book's footer in _config.yml (as book/assets.py
writes it for the build)."""
from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from book import assets

ROOT = Path(__file__).resolve().parents[2]
TEXT_LICENCE = "CC-BY-4.0"          # the chapter's text and notebooks (LICENSE-text)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def _citation() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))


def _repository() -> str:
    return _config()["repository"]["url"].rstrip("/")


def _pages_url(repository: str) -> str:
    """Where GitHub Pages publishes the book of ``https://github.com/<owner>/<name>``."""
    owner, name = repository.removeprefix("https://github.com/").split("/")
    return f"https://{owner.lower()}.github.io/{name}/"


def test_the_code_is_apache_and_the_text_cc_by():
    project = _project()
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    code, text = (ROOT / "LICENSE").read_text(), (ROOT / "LICENSE-text").read_text()
    assert "Apache License" in code and "Version 2.0, January 2004" in code
    assert "Creative Commons Attribution 4.0 International" in text
    assert "Attribution-ShareAlike" not in text and "NonCommercial" not in text


def test_citation_names_the_same_licences_version_authors_and_repository():
    citation, project = _citation(), _project()
    assert citation["cff-version"] == "1.2.0"
    assert citation["message"] and citation["title"]
    assert citation["version"] == project["version"], \
        "CITATION.cff's version must be pyproject.toml's: bump both together (and CHANGELOG.md)"
    assert citation["license"] == [project["license"], TEXT_LICENCE]
    assert [a["name"] for a in citation["authors"]] == [a["name"] for a in project["authors"]]
    assert citation["repository-code"] == _repository()
    assert citation["url"] == _pages_url(_repository())


def test_pyproject_urls_follow_the_books_repository():
    urls, repository = _project()["urls"], _repository()
    assert urls["Repository"] == repository
    assert urls["Documentation"] == _pages_url(repository)
    others = {key: url for key, url in urls.items() if key not in ("Repository", "Documentation")}
    assert all(url.startswith(repository + "/") for url in others.values()), others


def _changelog_versions() -> list[str]:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\]", text, flags=re.MULTILINE)


def test_the_changelog_opens_with_the_current_version():
    versions = _changelog_versions()
    assert versions and versions[0] == _project()["version"], \
        f"CHANGELOG.md needs a heading '## [{_project()['version']}] - ...' first; it has {versions}"
    as_tuples = [tuple(map(int, v.split("."))) for v in versions]
    assert as_tuples == sorted(as_tuples, reverse=True) and len(set(versions)) == len(versions)


def test_the_tag_the_notebooks_install_is_the_current_version():
    assert _config()["repository"]["kvlib_ref"] == "v" + _project()["version"]


def test_the_footer_states_the_terms():
    config, project = _config(), _project()
    assert config["author"] == project["authors"][0]["name"]
    footer = config["html"]["extra_footer"]
    assert "CC BY 4.0" in footer and "https://creativecommons.org/licenses/by/4.0/" in footer
    assert project["license"] in footer and "https://www.apache.org/licenses/LICENSE-2.0" in footer
    links = re.findall(r'href="(https://github\.com/[^"]+)"', footer)
    assert links and all(link.startswith(_repository() + "/") for link in links), links
    assert any(link.endswith("/CITATION.cff") for link in links)


def test_readme_says_which_licence_applies_to_what():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Licence\n", 1)[1].split("\n## ", 1)[0]
    for name in ("LICENSE", "LICENSE-text", "CITATION.cff", "CHANGELOG.md", "Apache-2.0", "CC BY 4.0",
                 "`kvlib/`", "`chapters/`"):
        assert name in section, f"README.md's Licence section does not name {name}"


def test_the_build_configuration_keeps_the_footer_and_is_valid(tmp_path):
    """What `make book` builds with (book/assets.py's copy of _config.yml) passes Jupyter Book's own
    schema and hands the footer to sphinx-book-theme, which declares that option (an unknown theme
    option would be a warning, and the build runs with -W)."""
    jb_config = pytest.importorskip("jupyter_book.config")
    theme = pytest.importorskip("sphinx_book_theme")
    out = tmp_path / "_config.book.yml"
    assets.write_config(out, static=True, cdn=True)
    written = yaml.safe_load(out.read_text(encoding="utf-8"))
    jb_config.validate_yaml(written, raise_on_errors=True)
    sphinx = jb_config.yaml_to_sphinx(written)[0]
    assert sphinx["html_theme_options"]["extra_footer"] == _config()["html"]["extra_footer"]
    assert sphinx["author"] == _config()["author"]
    conf = configparser.ConfigParser()
    conf.read(Path(theme.__file__).parent / "theme" / "sphinx_book_theme" / "theme.conf")
    assert "extra_footer" in conf["options"]


# --- every install line names something a learner can install ----------------------------------

INSTALL_DOCS = ("README.md", "chapters/instructors.md")
# pip's options that take a value (the value is not a requirement)
_VALUED = {"--index-url", "-i", "--extra-index-url", "-c", "--constraint", "-r", "--requirement",
           "-w", "--wheel-dir", "-d", "--dest", "-f", "--find-links"}


def _commands(text: str) -> list[str]:
    """The commands of a markdown text: each line of a fenced block, each inline code span (whose
    text may run over a line break)."""
    commands = []
    for i, part in enumerate(re.split(r"^```.*$", text, flags=re.MULTILINE)):
        if i % 2:
            commands += [line.split(" #")[0] for line in part.splitlines()]
        else:
            commands += re.findall(r"`([^`]+)`", re.sub(r"\s+", " ", part))
    return commands


def _requirements(command: str) -> list[str]:
    """The requirements a ``pip install`` command names (its arguments that are not options)."""
    args = shlex.split(command.split("pip install", 1)[1])
    return [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in _VALUED)]


def _installable(requirement: str) -> bool:
    config, version = _config()["repository"], _project()["version"]
    torch = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.MULTILINE).group(1)
    wheel = re.escape(f"kvlib-{version}-py3-none-any.whl")
    return (requirement in (".", f"torch=={torch}")                                  # this clone; the pinned torch
            or re.fullmatch(r"\.\[[a-z,]+\]", requirement) is not None                # this clone, with extras
            or re.fullmatch(rf"kvlib\[[a-z,]+\] @ git\+{re.escape(config['url'])}@{re.escape(config['kvlib_ref'])}",
                            requirement) is not None                                 # the release tag
            or re.fullmatch(rf"(dist/)?{wheel}(\[[a-z,]+\])?", requirement) is not None)  # make wheel's wheel


@pytest.mark.parametrize("doc", INSTALL_DOCS)
def test_every_install_line_names_something_installable(doc):
    """No bare ``pip install kvlib``: that name is not ours on PyPI. Each line installs from this
    clone, from the release tag _config.yml names, or from the wheel `make wheel` writes."""
    commands = [c for c in _commands((ROOT / doc).read_text(encoding="utf-8")) if "pip install" in c]
    assert commands, f"{doc} has no install line"
    wrong = [(c, r) for c in commands for r in _requirements(c) if not _installable(r)]
    assert not wrong, f"{doc}: install lines naming something that cannot be installed today: {wrong}"


def test_the_install_check_catches_a_bare_name():
    assert _requirements('pip install "kvlib[notebooks]"') == ["kvlib[notebooks]"]
    assert not _installable("kvlib[notebooks]") and not _installable("kvlib")
    assert not _installable("kvlib[notebooks] @ git+https://github.com/someone/else@v0.1.0")
    assert _requirements("pip install torch==2.13.0 --index-url https://x/cpu") == ["torch==2.13.0"]


def test_the_wheel_target_builds_the_version_of_pyproject():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^wheel: ", makefile, re.MULTILINE) and "pip wheel --quiet --no-deps" in makefile
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "dist/" in ignored and "build/" in ignored


# --- publishing: the workflows, the README's layout ---------------------------------------------

def _workflow(name: str) -> dict:
    data = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text(encoding="utf-8"))
    data["on"] = data.pop(True, data.get("on"))          # YAML 1.1 reads the key `on` as True
    return data


def _runs(job: dict) -> list[str]:
    return [step["run"].strip() for step in job["steps"] if "run" in step]


def test_ci_runs_make_test_on_every_push_and_pull_request():
    workflow = _workflow("test.yml")
    assert set(workflow["on"]) == {"push", "pull_request", "workflow_call"}
    [job] = workflow["jobs"].values()
    assert job["runs-on"].startswith("ubuntu") and job["container"]["image"].startswith("python:3.11-")
    runs = _runs(job)
    assert runs[-1] == "make test"
    assert any("apt-get install" in r and "chromium" in r for r in runs)


def test_pages_publishes_what_was_tested_on_a_release_tag():
    """On a tag: the tests first (test.yml itself), then the book from the stored outputs (nothing
    executed again on GitHub's machine), its launch buttons at the tag, then the deployment."""
    workflow = _workflow("pages.yml")
    assert workflow["on"] == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    test, build, deploy = (workflow["jobs"][k] for k in ("test", "build", "deploy"))
    assert test["uses"] == "./.github/workflows/test.yml" and build["needs"] == "test"
    assert _runs(build) == ["make book-static"] and build["env"]["BOOK_REF"] == "${{ github.ref_name }}"
    [upload] = [s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact@")]
    assert upload["with"]["path"] == "_build/html"
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert any(s.get("uses", "").startswith("actions/deploy-pages@") for s in deploy["steps"])
    assert _config()["repository"]["kvlib_ref"].startswith("v")          # a tag pages.yml reacts to


# The first major of each action that runs on Node.js 24 (GitHub removed Node 20 on 2026-09-16).
NODE_24 = {"actions/checkout": 5, "actions/cache": 5, "actions/upload-pages-artifact": 5, "actions/deploy-pages": 5}


def test_every_action_runs_on_node_24():
    for name in ("test.yml", "pages.yml"):
        for job in _workflow(name)["jobs"].values():
            for step in job.get("steps", []):
                if "uses" in step:
                    action, major = step["uses"].split("@")
                    assert int(major.lstrip("v")) >= NODE_24[action], f"{name}: {step['uses']}"


def test_a_release_site_opens_the_tag_and_refuses_another_than_the_colab_cells(tmp_path, monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("assets", ROOT / "book" / "assets.py")
    assets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(assets)
    ref = _config()["repository"]["kvlib_ref"]
    monkeypatch.setenv("BOOK_REF", ref)
    assets.write_config(tmp_path / "c.yml", static=True, cdn=True)
    assert yaml.safe_load((tmp_path / "c.yml").read_text())["repository"]["branch"] == ref
    monkeypatch.setenv("BOOK_REF", ref + "-other")
    with pytest.raises(SystemExit, match="Colab cell installs kvlib"):
        assets.write_config(tmp_path / "d.yml", static=True, cdn=True)


def _top_level() -> set[str]:
    """Every file and folder at the top of the repository that git tracks (or would: not ignored)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return {f.split("/")[0] + ("/" if "/" in f else "") for f in files}


def test_the_readme_is_short_and_says_what_a_newcomer_needs():
    """A newcomer's five minutes: under 1,200 words, the clone and the two commands, what to
    install per system, and what to do when it fails."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.split()) <= 1200
    for needed in ("git clone", "make book", "make test", "## What you need", "## When it fails", "WSL", "macOS"):
        assert needed in readme, needed


def test_the_readmes_layout_names_every_top_level_file_and_folder():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([^`\s]+)`", layout))
    missing = [p for p in sorted(_top_level())
               if p not in named and p.rstrip("/") not in named and not any(n.startswith(p) for n in named)]
    assert not missing, f"README.md's Layout section does not name {missing}"
