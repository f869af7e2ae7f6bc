"""Writing tokens one at a time, with the KV cache (each step feeds only the new token) or without
(re-feeding the whole text).

Small pieces, after gpt-fast: :func:`sample` picks the next token from logits (a pure
function), :func:`check_prompts` says what is wrong with a prompt, and one loop,
:func:`decode`, runs the steps (the prefill, then a *step* at a time: one token per row for a
:class:`PlainStep`, a few for :mod:`kvlib.speculative`'s) and keeps a record of each, with one
stop rule (:func:`finished`). :func:`generate` (one prompt) and :func:`generate_batch` (several)
are that loop with one row or many.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .cache.base import KVCache
from .compiled import compiled_decode_step
from .checks import non_negative_int, optional_positive_int
from .clock import Stopwatch


@dataclass
class StepRecord:
    """One step of generation: how many tokens the model saw and how long it took."""

    step: int            # 0 is the first new token (the prefill, with a cache)
    context_len: int     # tokens of context the new token was computed from (the longest row's)
    tokens_in: int       # tokens fed through the model this step, every row, padding included
    seconds: float
    batch: int = 1       # rows still writing at this step
    drafted: int = 0     # speculative decoding (kvlib.speculative): tokens drafted for this step
    accepted: int = 0    # ... how many of them the model accepted
    draft: tuple[int, ...] = ()   # ... and which they were


class Generation(list):
    """The new token ids of one prompt (a ``list[int]``), with how they were made:
    ``records``, one :class:`StepRecord` per step, and ``logits``, ``(n_new, vocab)`` float32 on
    the CPU, the scores each token was chosen from (kept when asked: ``keep_logits=True``)."""

    def __init__(self, tokens: Sequence[int] = (), records: list[StepRecord] | None = None,
                 logits: torch.Tensor | None = None) -> None:
        super().__init__(tokens)
        self.records = records if records is not None else []
        self.logits = logits

    @property
    def tokens(self) -> list[int]:
        return list(self)

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
    return _draw(logits, temperature, top_k, generator)


def _draw(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> torch.Tensor:
    """:func:`sample` for arguments already checked."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = probabilities(logits, temperature, top_k).reshape(-1, logits.shape[-1]).cpu()   # (rows, vocab)
    return torch.multinomial(probs, 1, generator=generator).reshape(logits.shape[:-1]).to(logits.device)


def probabilities(logits: torch.Tensor, temperature: float, top_k: int | None = None) -> torch.Tensor:
    """The distribution :func:`sample` draws from (``temperature > 0``): ``softmax(logits / T)``
    over the ``top_k`` most likely tokens (the others get 0), float32."""
    scaled = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]   # (..., 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def check_prompts(prompts: Sequence[Sequence[int] | torch.Tensor], vocab_size: int, max_seq_len: int,
                  max_new_tokens: int | Sequence[int], stop_token: int | None = None, *,
                  what: str = "prompt") -> list[list[int]]:
    """The prompts as lists of ints, or a ``TypeError``/``ValueError`` naming the ``what`` at fault
    by its index: no prompts, an empty prompt, an id outside the vocabulary, or a prompt that
    with its new tokens would not fit the model (nothing is cut short silently)."""
    if isinstance(prompts, (torch.Tensor, str, bytes)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
        raise ValueError("no prompts: give at least one list of token ids")
    news = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    return [check_prompt(f"{what} {i}", prompt, vocab_size, max_seq_len, n_new, stop_token)
            for i, (prompt, n_new) in enumerate(zip(prompts, news))]


def check_prompt(name: str, prompt: Sequence[int] | torch.Tensor, vocab_size: int, max_seq_len: int,
                 n_new: int, stop_token: int | None) -> list[int]:
    """One prompt as a list of ints, or a clear error that starts with ``name`` ("request 3")."""
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.is_floating_point() or prompt.dtype == torch.bool:
            raise TypeError(f"{name}: a tensor prompt must be 1-D and hold integer token ids, "
                            f"got shape {tuple(prompt.shape)}, dtype {prompt.dtype}")
        prompt = prompt.tolist()
    ids = list(prompt)
    if not ids:
        raise ValueError(f"{name} is empty: the model needs at least one token to continue from")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise TypeError(f"{name} must be a list of ints (token ids) or a 1-D integer tensor, got {ids[:5]}")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{name} holds token id {bad[0]}, outside the vocabulary 0..{vocab_size - 1}")
    if len(ids) + n_new > max_seq_len:
        raise ValueError(f"{name}: {len(ids)} tokens + max_new_tokens ({n_new}) = {len(ids) + n_new} exceeds "
                         f"the model's max_seq_len={max_seq_len}; shorten the prompt or ask for fewer tokens")
    if stop_token is not None and not (isinstance(stop_token, int) and 0 <= stop_token < vocab_size):
        raise ValueError(f"stop_token must be a token id in 0..{vocab_size - 1}, got {stop_token!r}")
    return ids


def padded(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, list[int] | None]:
    """Rows of different lengths as one ``(batch, longest)`` tensor, padded on the right with 0, and
    each row's length (``None`` when they are all the same: no padding)."""
    widths = [len(r) for r in rows]
    longest = max(widths)
    ids = torch.tensor([list(r) + [0] * (longest - len(r)) for r in rows], dtype=torch.long, device=device)
    return ids, (None if min(widths) == longest else widths)


StepFn = Callable[[torch.Tensor, KVCache], torch.Tensor]


@dataclass(frozen=True)
class Sampler:
    """How a step chooses a token from logits (:func:`sample`): greedy at ``temperature`` 0."""

    temperature: float = 0.0
    top_k: int | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k)                # once, not at every token

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return _draw(logits, self.temperature, self.top_k, self.generator)


@dataclass
class Written:
    """What one step wrote: per row its new tokens (one for a plain step) and the logits each was
    chosen from ``(n, vocab)``; the tokens it fed through the model; and, for a speculative step,
    how many tokens it drafted, which, and how many the model accepted."""

    tokens: list[list[int]]
    logits: list[torch.Tensor]
    tokens_in: int
    drafted: int = 0
    accepted: int = 0
    draft: tuple[int, ...] = ()


class PlainStep:
    """A step of plain decoding: one token per row, chosen from the logits after the row's last token
    (with the cache: the step feeds that token alone; ``step_fn(ids, cache)`` runs it, e.g. compiled)
    or after its whole text (without: every step feeds every row's text again)."""

    def __init__(self, model: torch.nn.Module, sampler: Sampler, *, use_cache: bool = True,
                 step_fn: StepFn | None = None) -> None:
        self.model, self.sampler, self.use_cache, self.step_fn = model, sampler, use_cache, step_fn

    def __call__(self, texts: list[list[int]], cache: KVCache | None, room: int) -> Written:
        device = next(self.model.parameters()).device
        if self.use_cache:
            feed, n_tokens = torch.tensor([[t[-1]] for t in texts], device=device), None      # (batch, 1)
        else:
            feed, n_tokens = padded(texts, device)
        if self.use_cache and self.step_fn is not None:
            logits = self.step_fn(feed, cache)[:, -1]                                           # (batch, vocab)
        else:
            logits = self.model(feed, cache, last_only=True, n_tokens=n_tokens)[:, -1]
        return _one_each(logits, self.sampler, feed.numel())


def _one_each(logits: torch.Tensor, sampler: Sampler, tokens_in: int) -> Written:
    """One token per row, chosen from ``logits`` ``(batch, vocab)``."""
    chosen = sampler(logits).tolist()
    return Written([[t] for t in chosen], [row[None] for row in logits], tokens_in)


def finished(output: Sequence[int], max_new_tokens: int, stop_token: int | None) -> bool:
    """The one stop rule: ``max_new_tokens`` written, or the last one is ``stop_token`` (kept)."""
    return len(output) >= max_new_tokens or (stop_token is not None and bool(output) and output[-1] == stop_token)


@torch.no_grad()
def decode(model: torch.nn.Module, rows: list[list[int]], max_new_tokens: int, *, use_cache: bool = True,
           cache: KVCache | None = None, sampler: Sampler = Sampler(), stop_token: int | None = None,
           progress: str | None = None, keep_logits: bool = False, step=None) -> list[Generation]:
    """The one generation loop: continue every row of ``rows`` (checked prompts) together.

    With the cache the first step runs every prompt (the *prefill*, right-padded to the longest,
    each row at its own length), and each later step is ``step(texts, cache, room)``, which writes
    the next tokens of every row (:class:`Written`): by default a :class:`PlainStep`, one token per
    row; a speculative step (:mod:`kvlib.speculative`) writes up to ``room + 1``. Without the cache
    every step is a plain one over every row's whole text. A row ends by :func:`finished`; a row
    that has ended keeps its place until every row has (a static batch). ``progress``: the label
    of a tqdm bar."""
    if use_cache:
        cache = cache or KVCache.for_model(model, batch=len(rows), max_len=max(map(len, rows)) + max_new_tokens)
        cache.reset()
    step = step or PlainStep(model, sampler, use_cache=use_cache)
    texts, out = [list(r) for r in rows], [Generation() for _ in rows]
    kept: list[list[torch.Tensor]] = [[] for _ in rows]
    records: list[StepRecord] = []
    bar = _bar(progress, max_new_tokens)
    while max_new_tokens and not all(finished(g, max_new_tokens, stop_token) for g in out):
        running = sum(not finished(g, max_new_tokens, stop_token) for g in out)
        context = max(map(len, texts))
        with Stopwatch(next(model.parameters()).device) as watch:
            if use_cache and not records:                           # the prefill: every prompt at once
                ids, n_tokens = padded(texts, cache.device)
                written = _one_each(prefill(model, ids, cache, n_tokens), sampler, ids.numel())
            else:
                written = step(texts, cache, max_new_tokens - min(len(g) for g in out) - 1)
        records.append(StepRecord(len(records), context, written.tokens_in, watch.seconds, running,
                                  written.drafted, written.accepted, written.draft))
        for row, gen in enumerate(out):
            _take(gen, texts[row], kept[row], written, row, max_new_tokens, stop_token, keep_logits)
        if bar is not None:
            bar.update(len(written.tokens[0]))
    if bar is not None:
        bar.close()
    for gen, rows_logits in zip(out, kept):
        gen.records = records
        if keep_logits:
            gen.logits = torch.cat(rows_logits) if rows_logits else torch.empty(0, model.config.vocab_size)
    return out


def _take(gen: Generation, text: list[int], kept: list[torch.Tensor], written: Written, row: int,
          max_new_tokens: int, stop_token: int | None, keep_logits: bool) -> None:
    """A row's share of a step: every token goes into its text (the next step feeds it); those
    written before the row :func:`finished` go into its output (and their logits, if kept)."""
    for i, token in enumerate(written.tokens[row]):
        text.append(token)
        if not finished(gen, max_new_tokens, stop_token):
            gen.append(token)
            if keep_logits:
                kept.append(written.logits[row][i:i + 1].float().cpu())


def prefill(model: torch.nn.Module, ids: torch.Tensor, cache: KVCache, n_tokens: list[int] | None) -> torch.Tensor:
    """Run the prompts ``ids`` (right-padded, row ``b`` holding ``n_tokens[b]`` tokens) into ``cache``:
    each row's last logits, ``(batch, vocab)``. In one pass, unless the cache stores whole rows
    (:attr:`kvlib.KVCache.ragged_prefill`): then one row at a time, without its padding."""
    if n_tokens is None or cache.ragged_prefill:
        return model(ids, cache, last_only=True, n_tokens=n_tokens)[:, -1]
    logits = [model(ids[row:row + 1, :n], cache.rows(row, row + 1), last_only=True)[:, -1]
              for row, n in enumerate(n_tokens)]
    cache.advance(n_tokens)
    return torch.cat(logits)


def plain_step(model: torch.nn.Module, sampler: Sampler, *, compile: bool = False, use_cache: bool = True,
               announce: bool = False) -> PlainStep:
    """The :class:`PlainStep` of :func:`generate` and :func:`generate_batch`: with ``compile=True`` its
    one-token steps run compiled (:func:`kvlib.compiled.compiled_decode_step`; ``announce``: its
    first call says so, and how long it took)."""
    if compile and not use_cache:
        raise ValueError("compile=True speeds up the one-token steps of cached decoding; use it with use_cache=True")
    step_fn = compiled_decode_step(model) if compile else None
    if step_fn is not None and announce:
        step_fn.announce = True
    return PlainStep(model, sampler, use_cache=use_cache, step_fn=step_fn)


def _bar(label: str | None, total: int):
    if label is None:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=label, unit="tok")


def generate(model: torch.nn.Module, prompt_ids: Sequence[int] | torch.Tensor, max_new_tokens: int, *,
             use_cache: bool = True, temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, stop_token: int | None = None,
             progress: bool = False, keep_logits: bool = False, cache: KVCache | None = None,
             compile: bool = False) -> Generation:
    """Continue ``prompt_ids`` by up to ``max_new_tokens`` tokens.

    Returns a :class:`Generation`: the new token ids (a ``list[int]``), one :class:`StepRecord`
    per step in ``.records``, and with ``keep_logits=True`` the logits each token was chosen
    from in ``.logits``.

    ``use_cache=True`` runs the prompt once (the *prefill*) and then feeds one token per
    step, reusing stored keys and values. ``use_cache=False`` feeds the whole sequence
    again at every step. Both choose the same tokens.

    Tokens are chosen by :func:`sample`: greedy by default; ``temperature > 0`` samples
    (optionally from the ``top_k`` most likely tokens) using ``generator``. Generation stops
    after ``stop_token`` is produced (it is included). ``progress=True`` shows a tqdm bar.
    ``cache`` lets the caller supply (and afterwards inspect) the cache; it is reset first.
    ``compile=True`` (with the cache) runs the one-token steps through
    :func:`kvlib.compiled.compiled_decode_step`: the same layers fused by ``torch.compile``,
    faster per step once compiled (the first call compiles, which takes a while; with
    ``progress=True`` it says so, and how long it took).
    """
    non_negative_int("max_new_tokens", max_new_tokens)
    sampler = Sampler(temperature, top_k, generator)             # (checks them)
    if isinstance(prompt_ids, torch.Tensor) and prompt_ids.dim() != 1:
        raise ValueError(f"prompt_ids must be 1-D (one sequence), got shape {tuple(prompt_ids.shape)}")
    cfg = model.config
    prompt = check_prompt("prompt_ids", prompt_ids, cfg.vocab_size, cfg.max_seq_len, max_new_tokens, stop_token)
    if not use_cache and cache is not None:
        raise ValueError("a cache was given but use_cache=False")
    step = plain_step(model, sampler, compile=compile, use_cache=use_cache, announce=progress)
    label = ("with cache" if use_cache else "without cache") if progress else None
    (gen,) = decode(model, [prompt], max_new_tokens, use_cache=use_cache, cache=cache, sampler=sampler,
                    stop_token=stop_token, progress=label, keep_logits=keep_logits, step=step)
    return gen


def generate_batch(model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                   stop_token: int | None = None, temperature: float = 0.0, top_k: int | None = None,
                   generator: torch.Generator | None = None, progress: bool = False, use_cache: bool = True,
                   cache: KVCache | None = None, keep_logits: bool = False, compile: bool = False) -> list[Generation]:
    """Continue every prompt of ``prompts`` (token-id lists of any lengths) together, one batch.

    Returns one :class:`Generation` per prompt, in order (the new ids, a ``list[int]``), each
    ending at its own ``stop_token`` (included) or after ``max_new_tokens``; they share
    ``.records`` (one per step of the batch) and, with ``keep_logits=True``, each has its own
    ``.logits``. ``cache`` may be any cache class built for ``len(prompts)`` rows
    (``Int8KVCache.for_model(model, batch=...)``, a sliding window, ...); it is reset first.

    Prompts of different lengths go into one batch padded on the right; the cache knows each
    row's own length (:attr:`kvlib.KVCache.lengths`), so every row's tokens sit at their own
    positions, its padding is never attended to, and each row computes what it would alone, up
    to the rounding of kernels that see another number of rows. A row that has stopped keeps its
    place until every row has (a static batch). ``compile=True`` runs the one-token steps compiled,
    as in :func:`generate`. This is :func:`generate`'s loop, :func:`decode`, with one row per prompt.
    """
    non_negative_int("max_new_tokens", max_new_tokens)
    sampler = Sampler(temperature, top_k, generator)             # (checks them)
    cfg = model.config
    rows = check_prompts(prompts, cfg.vocab_size, cfg.max_seq_len, max_new_tokens, stop_token)
    step = plain_step(model, sampler, compile=compile, use_cache=use_cache)
    label = f"batch of {len(rows)}" if progress else None
    return decode(model, rows, max_new_tokens, use_cache=use_cache, cache=cache, sampler=sampler,
                  stop_token=stop_token, progress=label, keep_logits=keep_logits, step=step)
