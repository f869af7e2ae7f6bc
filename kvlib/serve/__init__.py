"""Serving many sequences at once: batched generation and a scheduler.

- :mod:`.batch`: :func:`generate_batch`, prompts of any lengths in one left-padded batch;
- :mod:`.scheduler`: :func:`serve`, a stream of :class:`Request` served with static or
  continuous batching and chunked prefill, measured on the real model.
"""
from __future__ import annotations

from .batch import BatchGeneration, BatchStepRecord, check_prompts, generate_batch
from .scheduler import POLICIES, Request, ServeReport, SlotStep, serve

__all__ = ["generate_batch", "BatchGeneration", "BatchStepRecord", "check_prompts", "Request", "ServeReport",
           "SlotStep", "serve", "POLICIES"]
