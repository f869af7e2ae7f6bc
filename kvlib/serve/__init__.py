"""Serving many sequences at once: a small serving engine. (Prompts of any lengths in one
static batch, the loop of :func:`kvlib.generate` with a row per prompt, is
:func:`kvlib.generate_batch`, in :mod:`kvlib.generate`; it is named here too.)

- the engine, after nano-vllm: :mod:`.sequence` (a request being served), :mod:`.block_manager`
  (the KV pool's blocks: free list, reference counts, prefix caching), :mod:`.plan` (the
  scheduler: what each step runs), :mod:`.runner` (one forward pass per step over the paged
  pool), :mod:`.engine` (:class:`Engine` and :func:`serve`, which tie them together) and
  :mod:`.report` (:class:`Request` in, :class:`ServeReport` out); :mod:`.compiled` runs the
  runner's pass compiled (``Engine(..., compile=True)``, as vLLM compiles its model).
"""
from __future__ import annotations

from ..generate import generate_batch
from .block_manager import BlockManager, block_keys
from .engine import Engine, check_requests, serve
from .plan import POLICIES, Scheduler, StepPlan
from .report import Request, ServeReport, ServeStep
from .runner import ModelRunner, PagedKV
from .sequence import Sequence, Status

__all__ = ["generate_batch", "Engine", "serve", "Request", "ServeReport", "ServeStep", "POLICIES", "BlockManager",
           "block_keys", "Scheduler", "StepPlan", "ModelRunner", "PagedKV", "Sequence", "Status", "check_requests"]
