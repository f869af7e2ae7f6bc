"""Colab, as near as this machine can come: Colab ships ipywidgets 7.7.1 (no ``Stack``) and its
own widget manager. Here ipywidgets 7.7.1 is installed into a folder of its own, put ahead of the
book's 8.1.9 on ``sys.path``, and ``colab_ipywidgets7.py`` builds every widget of the chapter
under it, serialises its state as a notebook stores it and moves each control. What cannot be
tested here is Colab's frontend itself; the browser tests prove the static book (ipywidgets 8)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlib.widgets.html import has_stack, link_index, stack

ROOT = Path(__file__).resolve().parents[2]
COLAB = ("ipywidgets==7.7.1", "ipython_genutils==0.2.0")     # Colab's ipywidgets, and what 7.x imports
TARGET = ROOT / "_build" / "ipywidgets-7.7.1"


def _install() -> Path:
    """ipywidgets 7.7.1 in ``_build/ipywidgets-7.7.1`` (once), without dependencies: the rest
    (traitlets, ipykernel, comm) is the book's own."""
    stamp = TARGET / ".installed"
    if not stamp.exists():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                               str(TARGET), *COLAB], capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"could not install {', '.join(COLAB)} from the package index: {done.stderr[-300:]}")
        stamp.write_text(" ".join(COLAB) + "\n")
    return TARGET


@pytest.mark.slow
def test_every_widget_builds_serialises_and_follows_its_controls_under_colabs_ipywidgets_7():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_install()), str(ROOT)]))
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("colab_ipywidgets7.py"))],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 10 and all(r["stacks"] and r["controls_moved"] and r["state_bytes"] > 0 for r in rows)


def test_with_ipywidgets_8_the_views_are_a_real_stack_linked_in_the_browser():
    """The static book's path is unchanged: ipywidgets 8's Stack and a jslink."""
    import ipywidgets as widgets
    from ipywidgets.widgets.widget_link import Link

    assert has_stack()
    views, control = stack([widgets.HTML("a"), widgets.HTML("b")], selected_index=1), widgets.ToggleButtons(options=["a", "b"])
    assert isinstance(views, widgets.Stack) and views.selected_index == 1 and len(views.children) == 2
    assert isinstance(link_index(control, views), Link)
