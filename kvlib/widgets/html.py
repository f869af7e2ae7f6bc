"""What every widget of the chapter shares: colours, an HTML table, a box with a short
repr, and a slider linked to a stack of pre-drawn views.

The widgets work in the published HTML book, where no Python runs: each one draws all of
its views in advance and links its controls to them with ``jslink``, which runs in the
browser. The box keeps those links (``box.links``) so they live as long as the widget.

The views sit in an ``ipywidgets.Stack`` (:func:`stack`, linked by :func:`link_index`), new in
ipywidgets 8. Colab ships ipywidgets 7, which has none: there :func:`stack` returns a
:class:`Stack7`, a box that shows its selected view and swaps it in Python when the index
changes, linked through the kernel (Colab's notebooks run one), so the same widgets work
unchanged.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["UNCACHED", "UNCACHED_PALE", "CACHED", "CACHED_PALE", "BUILT_HERE", "ShortRepr", "widget_box",
           "html_table", "slider_stack", "stack", "link_index", "has_stack", "html_style"]

# Colours (colour-blind safe, after ColorBrewer Dark2)
UNCACHED, UNCACHED_PALE = "#d95f02", "#fde3cc"
CACHED, CACHED_PALE = "#1b9e77", "#e4e4e4"
BUILT_HERE = "measured on the machine that built this page"

_TABLE = '<table style="border-collapse:collapse;font-size:12px;margin-top:4px">{}</table>'
_TD = '<td style="padding:2px 10px;border-bottom:1px solid #ddd;text-align:{align}">{text}</td>'


def html_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A small HTML table: the first column left-aligned, the others right-aligned."""
    def tr(cells, tag="td"):
        out = []
        for i, c in enumerate(cells):
            cell = _TD.format(align="left" if i == 0 else "right", text=c)
            out.append(cell.replace("<td", "<th").replace("</td>", "</th>") if tag == "th" else cell)
        return "<tr>" + "".join(out) + "</tr>"
    return _TABLE.format(tr(header, "th") + "".join(tr(r) for r in rows))


class ShortRepr:
    """Mixin: a short, stable ``repr`` for a widget (its default repr would spell out every
    child and its HTML, which would then be stored in the notebook as text)."""

    summary = "widget"

    def __repr__(self) -> str:
        return self.summary


_BOX_CLASS = None


def widget_box(children, summary: str, links: Sequence = ()):
    """An ``ipywidgets.VBox`` (same model and view in the browser) whose repr is ``summary``
    and which keeps the ``jslink`` objects of its views in ``box.links``."""
    global _BOX_CLASS
    if _BOX_CLASS is None:
        import ipywidgets as widgets

        _BOX_CLASS = type("WidgetBox", (ShortRepr, widgets.VBox), {})
    box = _BOX_CLASS(children)
    box.summary, box.links = summary, list(links)
    return box


def has_stack() -> bool:
    """Whether this ipywidgets has ``Stack`` (8.0 and later); else :func:`stack` makes a :class:`Stack7`."""
    import ipywidgets as widgets

    return hasattr(widgets, "Stack")


_STACK7 = None


def html_style():
    """A new style object for ``ipywidgets.HTML`` views, to share between many of them (a smaller
    page): ipywidgets 8's ``HTMLStyle``, or ipywidgets 7's ``DescriptionStyle`` (it has no other)."""
    import ipywidgets as widgets

    kind = getattr(widgets.widget_string, "HTMLStyle", None) or widgets.widget_description.DescriptionStyle
    return kind()


def _stack7_class():
    """:class:`Stack7`, made on first use (ipywidgets is imported only when a widget is built)."""
    global _STACK7
    if _STACK7 is None:
        import ipywidgets as widgets
        import traitlets

        class Stack7(widgets.Box):
            """ipywidgets 7's stand-in for ``Stack``: a box showing ``views[selected_index]`` alone,
            swapped in Python whenever ``selected_index`` changes (so it needs a running kernel)."""

            selected_index = traitlets.Int(0)

            def __init__(self, views, selected_index: int = 0, **kwargs) -> None:
                self.views = list(views)
                super().__init__([self.views[selected_index]], **kwargs)
                self.selected_index = selected_index

            @traitlets.observe("selected_index")
            def _show(self, change) -> None:
                self.children = (self.views[change["new"]],)

        _STACK7 = Stack7
    return _STACK7


def stack(views, selected_index: int = 0, **kwargs):
    """``ipywidgets.Stack(views, selected_index=...)``; under ipywidgets 7, a :class:`Stack7`."""
    import ipywidgets as widgets

    if has_stack():
        return widgets.Stack(list(views), selected_index=selected_index, **kwargs)
    return _stack7_class()(views, selected_index, **kwargs)


def link_index(control, target, name: str = "index"):
    """Link ``control.<name>`` to ``target.selected_index``: ``jslink`` (in the browser, so the
    static book works) for a real ``Stack``; ``link`` (through the kernel) for a :class:`Stack7`."""
    import ipywidgets as widgets

    link = widgets.jslink if has_stack() else widgets.link
    return link((control, name), (target, "selected_index"))


def slider_stack(labels: Sequence[str], views: Sequence[str], description: str, start: int, interval: int):
    """A play button and a labelled slider, both ``jslink``-ed to a Stack of pre-drawn views.

    Returns ``(play, slider, stack, links)``.
    """
    import ipywidgets as widgets

    views_box = stack([widgets.HTML(v) for v in views], selected_index=start)
    slider = widgets.SelectionSlider(options=[(label, i) for i, label in enumerate(labels)], index=start,
                                     description=description, continuous_update=True,
                                     style={"description_width": "initial"},
                                     layout=widgets.Layout(width="420px"))
    play = widgets.Play(value=start, min=0, max=len(views) - 1, step=1, interval=interval,
                        description="play", layout=widgets.Layout(width="auto"))
    links = [link_index(slider, views_box), widgets.jslink((play, "value"), (slider, "index"))]
    return play, slider, views_box, links
