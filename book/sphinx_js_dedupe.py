"""A Sphinx extension: write each inline ``<script>`` of a page once.

Sphinx before 8.2 writes an inline script (``app.add_js_file(None, body=...)``) twice when
an extension adds it after ``Builder.init()``: once as given, and once more from the
registry in ``prepare_writing()`` with the file name ``''`` instead of ``None``, which
the builder does not recognise as the same script (sphinx-doc/sphinx#13402, fixed in
8.2). In this book sphinx-thebe and sphinx-togglebutton do that, and the second
``const THEBE_JS_URL = ...`` throws "Identifier 'THEBE_JS_URL' has already been
declared" on every page. Listed in ``_config.yml`` under ``sphinx: local_extensions``.
"""
from __future__ import annotations

from typing import Any

import sphinx


def _dedupe_scripts(app, pagename: str, templatename: str, context: dict[str, Any], doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[str, str]] = set()
    kept = []
    for js in scripts:
        filename = getattr(js, "filename", js) or ""
        key = (filename, repr(sorted(getattr(js, "attributes", {}).items())))
        if key in seen:
            continue
        seen.add(key)
        kept.append(js)
    scripts[:] = kept


def setup(app):
    if sphinx.version_info < (8, 2):
        # After every other handler that adds scripts (myst-nb adds the widget ones here).
        app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
