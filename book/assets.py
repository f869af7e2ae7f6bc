"""Fetch the JavaScript the published book needs, so that it works offline.

The HTML book loads two things that Sphinx and myst-nb would otherwise take from CDNs:

- the ipywidgets manager (require.js and ``@jupyter-widgets/html-manager``'s
  ``embed-amd.js`` with its fonts), which brings the stored widgets to life without a
  kernel, at the versions myst-nb 1.4.0 points its CDN configuration at;
- MathJax 3, which typesets the formulas.

This script downloads them at pinned versions from the npm registry with Python's standard
library (once: the tarballs are kept in ``_build/npm/`` and checked against the pinned SHA-512
that the registry itself publishes; neither npm nor Node.js is needed), and lays out the files
the pages request under ``_build/book-assets/_static/`` (``_config.yml``'s ``html_extra_path``
copies that folder into ``_build/html/``). It then writes the configuration the Makefile builds
with.

Where the registry cannot be reached, it says so and stops; ``BOOK_JS=cdn`` writes a
configuration that keeps myst-nb's and Sphinx's CDN defaults instead: the book then builds, but
needs the internet to show widgets and formulas (``make test``'s browser tests fail on it).

Usage: python book/assets.py CONFIG_OUT [--static] [--cdn]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"
NPM_CACHE = BUILD / "npm"               # the fetched tarballs
ASSETS = BUILD / "book-assets"          # html_extra_path: copied into _build/html/
STATIC = ASSETS / "_static"
STAMP = ASSETS / ".assets.json"

# name -> (version, npm's dist.integrity). require.js and html-manager are the versions
# of myst-nb 1.4.0's default `nb_ipywidgets_js` (cdnjs require.js 2.3.4, jsdelivr
# @jupyter-widgets/html-manager 1.0.6, the manager of ipywidgets 8.1.x); MathJax is
# the 3.x that Sphinx 7.4's default `mathjax_path` (mathjax@3 on jsdelivr) resolves to.
PACKAGES = {
    "requirejs": (
        "2.3.4",
        "sha512-qPD5gRrj6kGQ0ZySAJgqbArkaDqPMbQIT0zSZDkIv1mfA17w/tR2Faq5l2qqRf2CdQx6FWln9nUrgd2UDzb19A==",
    ),
    "@jupyter-widgets/html-manager": (
        "1.0.6",
        "sha512-+Mn+Ra8wyIHrYaUpfmf9A3dsLkt/NuwzPQN8sthdxBD35VV5cOJbpmgMhNR27n/rmP3mKyEe0PWCJrtZrXTXDQ==",
    ),
    "mathjax": (
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
    ),
}

FONT_SUFFIXES = (".woff2", ".woff", ".ttf", ".eot", ".svg")


def _wanted(name: str, member: str) -> str | None:
    """Where a file of package ``name`` goes under _static/, or None to leave it out.
    ``member`` is its path in the tarball, without the leading ``package/``."""
    if name == "requirejs":
        return "widgets/requirejs/require.js" if member == "require.js" else None  # licence in its header
    if name == "@jupyter-widgets/html-manager":
        # embed-amd.js is the whole manager (base, controls, output widgets) as AMD modules.
        base = "widgets/@jupyter-widgets/html-manager/"
        if member in ("package.json", "dist/embed-amd.js"):
            return base + member
        return None
    if name == "mathjax":
        # tex-mml-chtml.js plus everything it may load on demand, relative to itself
        # (TeX extensions, CHTML fonts, the menu, accessibility), not the other bundles.
        if member == "LICENSE":
            return "mathjax/LICENSE"
        if member.startswith("es5/") and (member == "es5/tex-mml-chtml.js" or member.count("/") >= 2):
            return "mathjax/" + member[len("es5/"):]
        return None
    raise KeyError(name)


def _also(name: str, member: str) -> list[str]:
    """Further places under _static/ for a file that _wanted() places once or not at all.

    embed-amd.js asks for its Font Awesome files (the icons of Play and Button widgets)
    relative to the URL of the AMD module whose CSS names them: require.js makes that
    ``<baseUrl>/@jupyter-widgets/controls.js`` for the controls and
    ``<baseUrl>/@jupyter-widgets/html-manager/dist/libembed-amd.js`` for the manager, and
    widgets-setup.js sets ``baseUrl`` to ``_static/widgets/``. So each font goes to
    ``widgets/@jupyter-widgets/`` and ``widgets/@jupyter-widgets/html-manager/dist/``
    (every format the CSS lists; a browser takes the first it supports, woff2)."""
    if name == "@jupyter-widgets/html-manager" and member.startswith("dist/") \
            and member.count("/") == 1 and member.endswith(FONT_SUFFIXES):
        font = member[len("dist/"):]
        return [f"widgets/@jupyter-widgets/{font}", f"widgets/@jupyter-widgets/html-manager/dist/{font}"]
    return []


def _integrity(path: Path) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


REGISTRY = os.environ.get("NPM_CONFIG_REGISTRY", "https://registry.npmjs.org").rstrip("/")


def _tarball(name: str, version: str) -> Path:
    # named as npm pack names them: scoped packages "scope-name-version.tgz"
    return NPM_CACHE / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"


def tarball_url(name: str, version: str) -> str:
    """The registry's address of a package's tarball (``@scope/name`` at ``@scope/name/-/name-1.0.tgz``)."""
    return f"{REGISTRY}/{name}/-/{name.rsplit('/', 1)[-1]}-{version}.tgz"


def download(name: str, version: str, integrity: str, opener=urllib.request.urlopen) -> Path:
    """The package's tarball in ``_build/npm/``, downloaded unless it is there intact, and checked
    against ``integrity`` (SystemExit saying so when it does not match: nothing is kept)."""
    tgz = _tarball(name, version)
    if tgz.is_file() and _integrity(tgz) == integrity:
        return tgz
    url = tarball_url(name, version)
    print(f"book/assets.py: downloading {url}", flush=True)
    with opener(url, timeout=60) as response:
        data = response.read()
    got = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != integrity:
        sys.exit(f"book/assets.py: {url} does not match the pinned integrity\n"
                 f"  expected {integrity}\n  got      {got}")
    tgz.parent.mkdir(parents=True, exist_ok=True)
    tmp = tgz.with_suffix(".part")
    tmp.write_bytes(data)
    os.replace(tmp, tgz)
    return tgz


def fetch(opener=urllib.request.urlopen) -> None:
    """Download every pinned package (unless already here and intact), check it, and lay
    out its files under _build/book-assets/_static/. Quick when nothing changed."""
    wanted = {name: {"version": v, "integrity": i} for name, (v, i) in PACKAGES.items()}
    setup_js = (Path(__file__).parent / "widgets-setup.js").read_bytes()
    wanted["widgets-setup.js"] = {"sha256": hashlib.sha256(setup_js).hexdigest()}
    wanted["assets.py"] = {"sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    if STAMP.is_file() and json.loads(STAMP.read_text()) == wanted:
        return
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(STATIC, ignore_errors=True)
    for name, (version, integrity) in PACKAGES.items():
        tgz = download(name, version, integrity, opener)
        count = 0
        with tarfile.open(tgz) as tar:
            for member in tar.getmembers():
                if not member.isfile() or not member.name.startswith("package/"):
                    continue
                inner = member.name[len("package/"):]
                dests = [d for d in [_wanted(name, inner)] if d] + _also(name, inner)
                if not dests:
                    continue
                data = tar.extractfile(member).read()
                for dest in dests:
                    target = STATIC / dest
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data)
                    count += 1
        print(f"book/assets.py: {name}@{version}: {count} files in {os.path.relpath(STATIC, ROOT)}/")
    (STATIC / "widgets" / "setup.js").write_bytes(setup_js)
    STAMP.write_text(json.dumps(wanted, indent=1))


def write_config(out: Path, *, static: bool, cdn: bool) -> None:
    """_config.yml, with execution off (``static``) and/or the CDN defaults (``cdn``)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    if static:
        config["execute"]["execute_notebooks"] = "off"
    # jupyter-book finds local extensions relative to the configuration file.
    local = config["sphinx"].get("local_extensions") or {}
    for name, path in local.items():
        local[name] = os.path.relpath(ROOT / path, out.resolve().parent)
    ref = os.environ.get("BOOK_REF", "")
    if ref:                                   # a release's site: its launch buttons open the tag's notebooks
        if ref != config["repository"]["kvlib_ref"]:
            sys.exit(f"book/assets.py: building the site of {ref}, but the notebooks' Colab cell installs kvlib "
                     f"from {config['repository']['kvlib_ref']} (repository.kvlib_ref in _config.yml): set it "
                     f"to {ref}, run python -m book.colab, and tag again")
        config["repository"]["branch"] = ref
    sphinx_config = config["sphinx"]["config"]
    if cdn:
        for key in ("html_extra_path", "nb_ipywidgets_js", "mathjax_path"):
            sphinx_config.pop(key, None)
    # Sphinx copies html_extra_path only when it writes pages, and writes none when no
    # page changed: a value that changes with the assets makes it rewrite them all.
    assets = "cdn" if cdn else hashlib.sha256(STAMP.read_bytes()).hexdigest()[:16]
    sphinx_config.setdefault("html_context", {})["book_assets"] = assets
    out.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by book/assets.py from _config.yml: edit that one.\n"
    out.write_text(header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config_out", type=Path, help="where to write the configuration to build with")
    parser.add_argument("--static", action="store_true", help="do not execute notebooks (use stored outputs)")
    parser.add_argument("--cdn", action="store_true", help="load the JavaScript from CDNs (nothing downloaded)")
    args = parser.parse_args(argv)
    cdn = args.cdn or os.environ.get("BOOK_JS", "") == "cdn"
    if cdn:
        shutil.rmtree(ASSETS, ignore_errors=True)
    else:
        try:
            fetch()
        except (urllib.error.URLError, OSError) as err:
            sys.exit(f"book/assets.py: the npm registry ({REGISTRY}) could not be reached: {err}.\n"
                     "The offline book serves the widget manager and MathJax from its own pages and needs them "
                     "once. Check the connection (or set NPM_CONFIG_REGISTRY to a mirror), or build a book "
                     "that loads them from CDNs instead: BOOK_JS=cdn make book")
    write_config(args.config_out, static=args.static, cdn=cdn)
    mode = "CDN (online only)" if cdn else "served from the book (offline)"
    print(f"book/assets.py: {args.config_out}: widget manager and MathJax {mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
