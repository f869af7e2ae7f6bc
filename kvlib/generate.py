"""Writing tokens one at a time, with the KV cache (the running total) or without (re-adding the list).

Three small pieces, after gpt-fast: :func:`sample` picks the next token from logits (a pure
function), one step runs the model (the prefill, then one token at a time), and
:func:`generate` loops over the steps and keeps a record of each.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence, overload

import torch

from .cache.base import KVCache
from .checks import non_negative_int, optional_positive_int
from .clock import Stopwatch


@dataclass
class StepRecord:
    """One step of generation: how many tokens the model saw and how long it took."""

    step: int            # 0 is the first new token (the prefill, with a cache)
    context_len: int     # tokens of context the new token was computed from
    tokens_in: int       # tokens fed through the model this step (1 with a warm cache)
    seconds: float


@dataclass
class Generation:
    """What :func:`generate` hands back with ``return_records=True``."""

    tokens: list[int]
    records: list[StepRecord] = field(default_factory=list)
    logits: torch.Tensor | None = None   # (n_new, vocab) float32 on the CPU: the logits each token was chosen from

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.records)


def check_sampling(temperature: float, top_k: int | None) -> None:
    """A ``ValueError`` unless ``temperature >= 0`` and ``top_k`` is ``None`` or a positive int."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    optional_positive_int("top_k", top_k)


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of each row of ``logits`` ``(..., vocab)``, as token ids ``(...)``.

    ``temperature == 0``: the most likely token (greedy). Otherwise a draw from
    ``softmax(logits / temperature)``, restricted to the ``top_k`` most likely tokens when
    ``top_k`` is given, using ``generator`` (a seeded ``torch.Generator`` on the CPU makes it
    repeatable). Nothing else is read or changed: the same inputs and generator state give
    the same tokens.
    """
    check_sampling(temperature, top_k)
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]   # (..., 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1).reshape(-1, scaled.shape[-1]).cpu()             # (rows, vocab)
    return torch.multinomial(probs, 1, generator=generator).reshape(scaled.shape[:-1]).to(logits.device)


def _as_prompt(prompt_ids: Sequence[int] | torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1:
            raise ValueError(f"prompt_ids must be 1-D (one sequence), got shape {tuple(prompt_ids.shape)}")
        if prompt_ids.is_floating_point() or prompt_ids.dtype == torch.bool:
            raise TypeError(f"prompt_ids must hold integer token ids, got dtype {prompt_ids.dtype}")
        ids = prompt_ids.to(device=device, dtype=torch.long)
    else:
        ids_list = list(prompt_ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids_list):
            raise TypeError("prompt_ids must be a list of ints or a 1-D LongTensor")
        ids = torch.tensor(ids_list, dtype=torch.long, device=device)
    if ids.numel() == 0:
        raise ValueError("prompt_ids is empty: the model needs at least one token to continue from")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"prompt token ids must lie in 0..{vocab_size - 1}, got values from {lo} to {hi}")
    return ids


@overload
def generate(model: torch.nn.Module, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
             use_cache: bool = ..., temperature: float = ..., top_k: int | None = ...,
             generator: torch.Generator | None = ..., stop_token: int | None = ..., progress: bool = ...,
             return_records: Literal[False] = ..., cache: KVCache | None = ..., compile: bool = ...) -> list[int]: ...


@overload
def generate(model: torch.nn.Module, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
             use_cache: bool = ..., temperature: float = ..., top_k: int | None = ...,
             generator: torch.Generator | None = ..., stop_token: int | None = ..., progress: bool = ...,
             return_records: Literal[True], cache: KVCache | None = ..., compile: bool = ...) -> Generation: ...


@torch.no_grad()
def generate(model: torch.nn.Module, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
             use_cache: bool = True, temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, stop_token: int | None = None,
             progress: bool = False, return_records: bool = False,
             cache: KVCache | None = None, compile: bool = False) -> list[int] | Generation:
    """Continue ``prompt_ids`` by up to ``max_new_tokens`` tokens.

    Returns the new token ids (a ``list[int]``), or with ``return_records=True`` a
    :class:`Generation`: the tokens, one :class:`StepRecord` per step and the logits each
    token was chosen from (the two overloads give type checkers the exact type).

    ``use_cache=True`` runs the prompt once (the *prefill*) and then feeds one token per
    step, reusing stored keys and values. ``use_cache=False`` feeds the whole sequence
    again at every step. Both choose the same tokens.

    Tokens are chosen by :func:`sample`: greedy by default; ``temperature > 0`` samples
    (optionally from the ``top_k`` most likely tokens) using ``generator``. Generation stops
    after ``stop_token`` is produced (it is included). ``progress=True`` shows a tqdm bar.
    ``cache`` lets the caller supply (and afterwards inspect) the cache; it is reset first.
    ``compile=True`` (with the cache) runs the one-token steps through
    :func:`kvlib.compiled.compiled_decode_step`: the same layers fused by ``torch.compile``,
    faster per step once compiled (the first call compiles, which takes a while).
    """
    non_negative_int("max_new_tokens", max_new_tokens)
    check_sampling(temperature, top_k)
    cfg = model.config
    device = next(model.parameters()).device
    ids = _as_prompt(prompt_ids, cfg.vocab_size, device)
    total = ids.numel() + max_new_tokens
    if total > cfg.max_seq_len:
        raise ValueError(f"prompt ({ids.numel()} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                         f"exceeds the model's max_seq_len={cfg.max_seq_len}")
    if use_cache:
        if cache is None:
            cache = KVCache.for_model(model, batch=1, max_len=total)
        cache.reset()
    elif cache is not None:
        raise ValueError("a cache was given but use_cache=False")
    if compile and not use_cache:
        raise ValueError("compile=True speeds up the one-token steps of cached decoding; use it with use_cache=True")
    if compile:
        from .compiled import compiled_decode_step
        decode_step = compiled_decode_step(model)
    else:
        def decode_step(feed: torch.Tensor, cache: KVCache) -> torch.Tensor:
            return model(feed, cache, last_only=True)

    feed = ids[None]                                   # (1, seq): what goes through the model this step
    n_context = ids.numel()
    new: list[int] = []
    records: list[StepRecord] = []
    step_logits: list[torch.Tensor] = []
    steps = range(max_new_tokens)
    if progress:
        from tqdm.auto import tqdm
        steps = tqdm(steps, desc="with cache" if use_cache else "without cache", unit="tok")
    for step in steps:
        with Stopwatch(device) as watch:
            if use_cache and step > 0:
                logits = decode_step(feed, cache)[0, -1]                              # (vocab,)
            else:                           # the prefill, or the whole text again without a cache
                logits = model(feed, cache if use_cache else None, last_only=True)[0, -1]
            token = int(sample(logits, temperature, top_k, generator))
        records.append(StepRecord(step, context_len=n_context, tokens_in=feed.shape[1], seconds=watch.seconds))
        if return_records:
            step_logits.append(logits.float().cpu())
        new.append(token)
        n_context += 1
        nxt = torch.tensor([[token]], dtype=torch.long, device=device)
        # With the cache only the new token goes in; without it, the whole sequence again.
        feed = nxt if use_cache else torch.cat([feed, nxt], dim=1)
        if stop_token is not None and token == stop_token:
            break
    if progress:
        steps.close()
    if not return_records:
        return new
    logits_t = torch.stack(step_logits) if step_logits else torch.empty(0, cfg.vocab_size)
    return Generation(tokens=new, records=records, logits=logits_t)
