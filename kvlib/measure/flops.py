"""How much arithmetic one step of generation does, with and without the KV cache: closed form.

One forward call of :class:`kvlib.Decoder` feeds ``tokens_in`` new tokens that attend to
``context_len`` keys (the tokens already stored plus the new ones):

- uncached step at context ``n``: ``tokens_in = n``, ``context_len = n``;
- cached step at context ``n``: ``tokens_in = 1``, ``context_len = n``;
- a prompt chunk after ``p`` cached tokens: ``tokens_in = t``, ``context_len = p + t``.

Its floating-point operations (a multiply-add counts as 2, as PyTorch's
``FlopCounterMode`` counts them) fall into three parts:

``linear``
    the projections (``wq, wk, wv, wo``) and the MLP, ``tokens_in × linear_per_token``:
    every token fed goes through every weight matrix of every layer;
``attention``
    the scores ``q·k`` and the weighted sum of values, ``tokens_in × context_len ×
    attention_per_pair``: every new query against every key;
``output``
    the output layer (logits over the vocabulary): one row with ``last_only=True``
    (what generation needs), ``tokens_in`` rows otherwise.

These are exactly the numbers :func:`count_flops` (PyTorch's counter) reports for that call
(``tests/measure/test_flops.py`` checks it). Two conventions of that counter matter here:
element-wise work (RMSNorm, RoPE, softmax, SiLU) and the embedding lookup are not
counted, and attention is counted over the whole ``tokens_in × context_len`` rectangle
even where the causal mask hides a score (a plain implementation computes them and masks
them; a kernel that skips masked blocks saves up to half of the attention part).

The bottom of the module counts with PyTorch's counter and runs *one step* of a real model
the same way, so a notebook can put counted FLOPs, closed-form FLOPs and measured seconds
side by side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..cache.base import KVCache
from ..checks import non_negative_int, positive_int
from ..config import Config
from ..compiled import compiled_decode_step

__all__ = [
    "StepFlops", "linear_flops_per_token", "attention_flops_per_pair", "output_flops_per_row",
    "step_flops", "generation_step_flops", "generation_flops", "generation_ratio",
    "crossover_context", "count_flops", "step_call", "count_step_flops", "fmt_flops",
]


# ---------------------------------------------------------------------------------------
# The three coefficients of a configuration
# ---------------------------------------------------------------------------------------

def linear_flops_per_token(config: Config) -> int:
    """FLOPs of the projections and the MLP for one token, summed over all layers.

    Per layer: ``wq`` (d × heads·head_dim), ``wk`` and ``wv`` (d × kv_heads·head_dim),
    ``wo`` (heads·head_dim × d) and the SwiGLU MLP's three matrices (d × d_mlp), each
    costing ``2 × rows × columns`` per token.
    """
    c = config
    q_width, kv_width = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    per_layer = 2 * c.d_model * (q_width + 2 * kv_width) + 2 * q_width * c.d_model + 3 * 2 * c.d_model * c.d_mlp
    return c.n_layers * per_layer


def attention_flops_per_pair(config: Config) -> int:
    """FLOPs of attention for one (query, key) pair, summed over all layers and query heads:
    ``2·head_dim`` for the score ``q·k`` plus ``2·head_dim`` to add ``p·v`` to the output.

    Grouped-query attention does not change it: fewer key/value heads are *stored*, but
    every query head still scores every key.
    """
    c = config
    return c.n_layers * c.n_heads * 4 * c.head_dim


def output_flops_per_row(config: Config) -> int:
    """FLOPs of the output layer (logits over the vocabulary) for one position."""
    return 2 * config.d_model * config.vocab_size


def crossover_context(config: Config) -> float:
    """The context length at which attention does as much arithmetic as the projections and
    MLP: ``linear_flops_per_token / attention_flops_per_pair``.

    It is the same for an uncached step (``n·linear`` against ``n²·pair``) and for a
    cached one (``linear`` against ``n·pair``). For a Llama-style shape it works out to
    ``d_model + kv_heads·head_dim + 1.5·d_mlp`` tokens: below it the part that grows in
    step with the context dominates, well above it the quadratic part does.
    """
    return linear_flops_per_token(config) / attention_flops_per_pair(config)


# ---------------------------------------------------------------------------------------
# One step, and a whole generation
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepFlops:
    """The arithmetic of one forward call, split by what it grows with."""

    tokens_in: int       # tokens fed through the model
    context_len: int     # keys each of them may attend to (stored + new)
    linear: int          # projections + MLP: grows with tokens_in
    attention: int       # scores + weighted sum: grows with tokens_in × context_len
    output: int          # output layer: one row (last_only) or tokens_in rows

    @property
    def total(self) -> int:
        return self.linear + self.attention + self.output

    def __int__(self) -> int:
        return self.total


def step_flops(config: Config, context_len: int, tokens_in: int, *, last_only: bool = True,
               batch: int = 1) -> StepFlops:
    """FLOPs of ``model(ids, cache, last_only=last_only)`` where ``ids`` holds ``tokens_in``
    tokens and attention sees ``context_len`` keys (so ``context_len - tokens_in`` of them
    were already in the cache). ``batch`` sequences cost ``batch`` times as much.
    """
    context_len, tokens_in, batch = (positive_int("context_len", context_len), positive_int("tokens_in", tokens_in),
                                     positive_int("batch", batch))
    if tokens_in > context_len:
        raise ValueError(f"tokens_in={tokens_in} cannot exceed context_len={context_len}: the keys "
                         f"include the new tokens themselves")
    rows_out = 1 if last_only else tokens_in
    return StepFlops(
        tokens_in=tokens_in,
        context_len=context_len,
        linear=batch * tokens_in * linear_flops_per_token(config),
        attention=batch * tokens_in * context_len * attention_flops_per_pair(config),
        output=batch * rows_out * output_flops_per_row(config),
    )


def generation_step_flops(config: Config, prompt_len: int, n_new: int, *, use_cache: bool,
                          last_only: bool = True) -> list[StepFlops]:
    """The FLOPs of every step of ``kvlib.generate(model, prompt, n_new, use_cache=...)``.

    Step ``s`` (0-based) chooses token ``s`` from a context of ``prompt_len + s`` tokens.
    Without the cache it feeds all of them; with the cache step 0 is the prefill (the
    whole prompt) and every later step feeds one token.
    """
    positive_int("prompt_len", prompt_len)
    non_negative_int("n_new", n_new)
    steps = []
    for s in range(n_new):
        n = prompt_len + s
        tokens_in = n if (not use_cache or s == 0) else 1
        steps.append(step_flops(config, n, tokens_in, last_only=last_only))
    return steps


def generation_flops(config: Config, prompt_len: int, n_new: int, *, use_cache: bool,
                     last_only: bool = True) -> int:
    """Total FLOPs of generating ``n_new`` tokens after a ``prompt_len``-token prompt."""
    return sum(s.total for s in generation_step_flops(config, prompt_len, n_new, use_cache=use_cache,
                                                       last_only=last_only))


def generation_ratio(config: Config, n_new: int, *, prompt_len: int = 1, last_only: bool = True) -> float:
    """How many times more arithmetic generating ``n_new`` tokens takes without the cache.

    With a one-token prompt the steps see contexts ``1 .. n_new``. For large ``n`` the
    ratio tends to ``(a·n/2 + b·n²/3 + o) / (a + b·n/2 + o)`` with ``a``, ``b``, ``o`` the
    per-token, per-pair and output coefficients: about ``n/2`` while the linear part
    dominates, up to ``2n/3`` once attention does.
    """
    uncached = generation_flops(config, prompt_len, n_new, use_cache=False, last_only=last_only)
    cached = generation_flops(config, prompt_len, n_new, use_cache=True, last_only=last_only)
    return uncached / cached


# ---------------------------------------------------------------------------------------
# The same step on a real model: run it, count it, time it
# ---------------------------------------------------------------------------------------

def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of one fused attention call, as PyTorch counts its GPU kernels: both matmuls
    (scores ``q @ k^T`` and the weighted sum ``p @ v``) over every query-key pair, mask or
    not (the counter does not discount the causal mask); grouped-query heads broadcast."""
    b, h_q, s_q, d_qk = query_shape
    d_v = value_shape[-1]
    s_k = key_shape[-2]
    return 2 * b * h_q * s_q * s_k * d_qk + 2 * b * h_q * s_q * s_k * d_v


def count_flops(fn: Callable[[], Any]) -> int:
    """Floating-point operations PyTorch counts while ``fn`` runs (a multiply-add counts as 2).

    Matrix products (every ``nn.Linear``, ``@``) and attention are counted; element-wise
    work (norms, RoPE, softmax, activations) is not. ``FlopCounterMode`` has no formula
    for the CPU attention kernel (``_scaled_dot_product_flash_attention_for_cpu``) and
    would count attention as 0 on a CPU; we give it the formula it uses for its GPU
    attention kernels, so a CPU counts attention the way PyTorch counts it on a GPU.
    """
    from torch.utils.flop_counter import FlopCounterMode

    mapping = {}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:
        mapping[cpu_sdpa] = _sdpa_flops
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    return counter.get_total_flops()



def step_call(model: torch.nn.Module, context_len: int, *, use_cache: bool, tokens_in: int = 1,
              ids: Sequence[int] | None = None, last_only: bool = True, seed: int = 0,
              compile: bool = False) -> Callable[[], torch.Tensor]:
    """A function that runs *one* generation step of ``model`` at ``context_len`` tokens of
    context, and can be called again and again: the one step fixture of every measurement (to
    time a step, count its FLOPs, compare kernels).

    Without the cache the step feeds all ``context_len`` tokens. With the cache the first
    ``context_len - tokens_in`` tokens are prefilled once, here, and every call feeds the last
    ``tokens_in`` (rolling the cache back first, so each call is the same step: a decode step for
    one token, a verify step of speculative decoding for several). ``ids``: the context's tokens
    (default: seeded random ids; the arithmetic does not depend on them). ``last_only=False``
    computes the logits of every fed position, as a verify step does. ``compile=True`` (with the
    cache, one token) runs the step compiled (:func:`kvlib.compiled.compiled_decode_step`).
    """
    cfg = model.config
    if not isinstance(context_len, int) or not 1 <= context_len <= cfg.max_seq_len:
        raise ValueError(f"context_len must be an int in 1..{cfg.max_seq_len}, got {context_len!r}")
    if not isinstance(tokens_in, int) or not 1 <= tokens_in <= context_len:
        raise ValueError(f"tokens_in must be an int in 1..context_len={context_len}, got {tokens_in!r}")
    device = next(model.parameters()).device
    if ids is None:
        ids = torch.randint(0, cfg.vocab_size, (context_len,), generator=torch.Generator().manual_seed(seed)).tolist()
    if len(ids) != context_len:
        raise ValueError(f"ids holds {len(ids)} tokens, context_len is {context_len}")
    ids = torch.tensor([list(ids)], device=device)                                    # (1, context_len)
    if not use_cache:
        return lambda: _no_grad(model, ids, None, last_only)
    cache = KVCache.for_model(model, batch=1, max_len=context_len)
    stored = context_len - tokens_in
    if stored:
        _no_grad(model, ids[:, :stored], cache, True)
    feed = ids[:, stored:]
    run = compiled_decode_step(model) if compile else (lambda x, c: model(x, c, last_only=last_only))

    def cached_step() -> torch.Tensor:
        cache.truncate(stored)         # the same step every call: the last tokens after `stored`
        with torch.no_grad():
            return run(feed, cache)
    return cached_step


def _no_grad(model: torch.nn.Module, ids: torch.Tensor, cache: KVCache | None, last_only: bool) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, cache, last_only=last_only)


def count_step_flops(model: torch.nn.Module, context_len: int, *, use_cache: bool) -> int:
    """FLOPs PyTorch counts (:func:`count_flops`) for one step of ``model``."""
    return count_flops(step_call(model, context_len, use_cache=use_cache))


def fmt_flops(flops: float) -> str:
    """A count of floating-point operations with three significant digits:
    ``29_262_938_112 -> '29.3 GFLOP'``. Counted FLOPs do not vary between runs."""
    units = (("FLOP", 1.0), ("kFLOP", 1e3), ("MFLOP", 1e6), ("GFLOP", 1e9), ("TFLOP", 1e12),
             ("PFLOP", 1e15), ("EFLOP", 1e18))
    for i, (unit, scale) in enumerate(units):
        value = float(f"{flops / scale:.3g}")
        if abs(value) < 1000 or i == len(units) - 1:
            return f"{flops:.0f} FLOP" if scale == 1.0 else f"{value:.3g} {unit}"
    raise AssertionError("unreachable")
