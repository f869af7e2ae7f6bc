"""Whether kvlib's paged-attention kernel pays on this machine: measured, as the panels are.

The serving engine can read every token's keys straight from the paged pool with
:func:`kvlib.fast.paged_attention`, or gather each request's keys into a padded tensor for
PyTorch's attention (the default). Which is faster depends on the CPU, the model's shapes and
the threads: on macOS without OpenMP the kernel runs on one thread. :func:`paged_attention_choice`
times both on the model's shapes, every layer's attention of a step alone (the model's
products do not run: the pool holds zeros, and a step's time would drown the difference), for
a decode step of several requests and for a prompt's prefill, and takes the kernel only where
it is faster in all. The scheduler and the runner lay the steps out as they do when serving.
"""
from __future__ import annotations

import torch

from ..serve import Engine, Request
from .choose import MEDIAN_IN_HALF_A_SECOND, Timer
from .kernels import kernels_missing, load, paged_attention

__all__ = ["attention_ms", "paged_attention_choice"]

# (requests, prompt tokens, which step is timed): a decode step of 8 requests at 512 tokens, and
# one request's prefill of 256 tokens (prompts cut to what the model's max_seq_len holds).
CASES = ((8, 512, "decode"), (1, 256, "prefill"))


def attention_ms(model: torch.nn.Module, kernel, rows: int, prompt: int, step: str,
                 timer: Timer = MEDIAN_IN_HALF_A_SECOND) -> float:
    """Milliseconds of every layer's attention in one step of the engine (``kernel``: its
    ``paged_attention``, or ``None`` for the gathered keys): ``step="prefill"``, the first step of
    ``rows`` requests of ``prompt`` tokens; ``"decode"``, their step once each has its first token."""
    if step not in ("prefill", "decode"):
        raise ValueError(f"step is 'prefill' or 'decode', got {step!r}")
    cfg = model.config
    engine = Engine(model, max_batch=rows, block_size=16, paged_attention=kernel)
    g = torch.Generator().manual_seed(0)
    for i in range(rows):
        engine.add(Request(torch.randint(0, cfg.vocab_size, (prompt,), generator=g).tolist(), 4), i)
    scheduler, runner = engine.scheduler, engine.runner
    plan = scheduler.schedule(float("inf"))
    while step == "decode" and any(n > 1 for _, n in plan.items):    # prefills, not run: the pool keeps zeros
        scheduler.postprocess(plan, {i: 0 for i, (s, n) in enumerate(plan.items) if s.num_computed + n == s.num_tokens})
        plan = scheduler.schedule(float("inf"))
    runner.kv.grow(engine.blocks.capacity)
    runner.kv.layout = runner.layout(plan)[0]
    tokens = sum(n for _, n in plan.items)
    dtype = runner.kv.k.dtype
    q = torch.randn(1, cfg.n_heads, tokens, cfg.head_dim, generator=g).to(dtype)        # (1, heads, tokens, dim)
    k, v = (torch.randn(1, cfg.n_kv_heads, tokens, cfg.head_dim, generator=g).to(dtype) for _ in range(2))
    with torch.no_grad():
        return 1e3 * timer(lambda: [runner.kv.attend(layer, q, k, v, None, 0) for layer in range(cfg.n_layers)])


def paged_attention_choice(model: torch.nn.Module, timer: Timer = MEDIAN_IN_HALF_A_SECOND):
    """``(kernel, why)``: :func:`kvlib.fast.paged_attention` where it is built here and faster than
    the gathered keys in every case of :data:`CASES`, else ``None``; ``why``, in a few words, why
    not (``""`` where it is used). The times: :func:`attention_ms`."""
    if not load():
        return None, str(kernels_missing())
    longest = model.config.max_seq_len - 4                           # room for the tokens each request asks
    for rows, prompt, step in ((rows, min(prompt, longest), step) for rows, prompt, step in CASES):
        if attention_ms(model, paged_attention, rows, prompt, step, timer) >= attention_ms(model, None, rows, prompt,
                                                                                            step, timer):
            return None, f"not faster here than the gathered keys (a {step} of {rows} × {prompt} tokens)"
    return paged_attention, ""
