"""Every widget and plot of the chapter. The widgets work in the published HTML book with no
kernel running: each draws all its views in advance and links its controls to them in the
browser (:mod:`.html` holds what they share).

- :mod:`.context`: one step's cost at a chosen context length (:func:`context_cost_widget`);
- :mod:`.total`: the total arithmetic of generating n tokens (:func:`total_arithmetic_widget`);
- :mod:`.memory`: the KV-cache memory calculator (:func:`memory_calculator_widget`);
- :mod:`.plots`: matplotlib figures (:func:`plot_step_times`).
"""
from __future__ import annotations

from .context import ContextPoint, context_cost_data, context_cost_widget, render_context_view
from .memory import MemoryPoint, memory_calculator_widget, memory_point, render_memory_view
from .plots import plot_step_times, rolling_median
from .total import TotalPoint, render_total_view, total_arithmetic_data, total_arithmetic_widget

__all__ = ["ContextPoint", "context_cost_data", "render_context_view", "context_cost_widget", "TotalPoint",
           "total_arithmetic_data", "render_total_view", "total_arithmetic_widget", "MemoryPoint", "memory_point",
           "render_memory_view", "memory_calculator_widget", "plot_step_times", "rolling_median"]
