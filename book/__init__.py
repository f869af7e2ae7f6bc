"""The book's build helpers. Some are Sphinx local extensions that ``_config.yml`` loads by path
(``runtimes.py``, ``sphinx_js_dedupe.py``); ``student_edition/`` is a package
(``python -m book.student_edition``)."""
