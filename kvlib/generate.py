"""Writing tokens one at a time, with the KV cache (the running total) or without (re-adding the list)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .cache import KVCache


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


def _choose(logits: torch.Tensor, temperature: float, top_k: int | None,
            generator: torch.Generator | None) -> int:
    """Pick the next token from ``logits`` of shape ``(vocab,)``: greedy, or sampled."""
    if temperature == 0.0:
        return int(torch.argmax(logits))
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model: torch.nn.Module, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
             use_cache: bool = True, temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, stop_token: int | None = None,
             progress: bool = False, return_records: bool = False,
             cache: KVCache | None = None, compile: bool = False) -> list[int] | Generation:
    """Continue ``prompt_ids`` by up to ``max_new_tokens`` tokens and return the new ids.

    ``use_cache=True`` runs the prompt once (the *prefill*) and then feeds one token per
    step, reusing stored keys and values. ``use_cache=False`` feeds the whole sequence
    again at every step. Both choose the same tokens.

    Greedy by default; ``temperature > 0`` samples (optionally from the ``top_k`` most
    likely tokens) using ``generator`` (a seeded ``torch.Generator`` makes it repeatable).
    Generation stops after ``stop_token`` is produced (it is included). ``progress=True``
    shows a tqdm bar. With ``return_records=True`` a :class:`Generation` comes back
    holding the tokens, one :class:`StepRecord` per step and the logits of each step.
    ``cache`` lets the caller supply (and afterwards inspect) the cache; it is reset first.
    ``compile=True`` (with the cache) runs the one-token steps through
    :func:`kvlib.compiled.compiled_decode_step`: the same layers fused by ``torch.compile``,
    faster per step once compiled (the first call compiles, which takes a while).
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
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
        step_fn = compiled_decode_step(model)

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
        _sync(device)
        t0 = time.perf_counter()
        if compile and step > 0:
            logits = step_fn(feed, cache)[0, -1]
        else:
            logits = model(feed, cache if use_cache else None, last_only=True)[0, -1]   # (vocab,)
        token = _choose(logits, temperature, top_k, generator)
        _sync(device)
        seconds = time.perf_counter() - t0
        records.append(StepRecord(step, context_len=n_context, tokens_in=feed.shape[1], seconds=seconds))
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
