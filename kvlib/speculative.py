"""Speculative decoding: guess several tokens cheaply, check them with the model in one step.

A cached decode step is memory-bound: it reads every weight to compute one token, so checking
``k + 1`` tokens in one step costs little more than one. Each step here:

1. **drafts** up to ``k`` tokens: by *prompt lookup* (the tokens that followed the last
   ``ngram`` tokens where they occurred before in the text, no second model), or with a
   cheaper *draft model* of the same vocabulary, greedily or sampled;
2. **verifies** them: the model runs its last token and the drafts in one forward pass
   through its cache (several new tokens after cached ones: the causal mask with an offset);
3. **accepts** the longest run of drafts the model agrees with, plus one token of the model's
   own, and **rolls the cache back** past what was rejected.

Greedy, every token is the model's own greedy choice, so the tokens are those of
:func:`kvlib.generate` (up to the rounding of a step that sees several tokens, which can part
the two only at a near-tie). Sampling, a draft is accepted with probability ``min(1, p/q)``
and otherwise replaced by a draw from the normalised ``max(0, p - q)`` (Leviathan et al.,
2023; Chen et al., 2023), so the tokens follow the model's own distribution ``p``.
"""
from __future__ import annotations

import torch

from .cache.base import KVCache
from .checks import non_negative_int, positive_int
from .clock import Stopwatch
from .generate import Generation, StepRecord, check_prompt, check_sampling, probabilities, sample

__all__ = ["generate", "lookup_draft", "accept", "DRAFTS"]

DRAFTS = ("prompt_lookup",)


def lookup_draft(tokens: list[int], k: int, ngram: int) -> list[int]:
    """Prompt lookup: the up to ``k`` tokens that followed the most recent earlier occurrence of the
    last ``ngram`` tokens of ``tokens`` (``[]`` if they did not occur before)."""
    if len(tokens) <= ngram:
        return []
    tail = tokens[-ngram:]
    for start in range(len(tokens) - ngram - 1, -1, -1):        # the most recent occurrence first
        if tokens[start:start + ngram] == tail:
            return tokens[start + ngram:start + ngram + k]
    return []


def accept(drafts: list[int], p: torch.Tensor, q: torch.Tensor | None, generator: torch.Generator | None,
           greedy: bool) -> list[int]:
    """The tokens a verify step keeps: the accepted drafts, then one token of the model's own.

    ``p`` ``(len(drafts) + 1, vocab)``: the model's distributions after each prefix (greedy: its
    logits). ``q`` ``(len(drafts), vocab)``: the drafter's distributions (``None``: the drafts were
    certain, as prompt lookup's are). Greedy: a draft is kept while it is the model's argmax.
    Sampling: kept with probability ``min(1, p(d) / q(d))``; the first rejected one is replaced
    by a draw from ``max(0, p - q)``, normalised; if all are kept, one more is drawn from ``p``.
    """
    out: list[int] = []
    for j, d in enumerate(drafts):
        if greedy:
            best = int(p[j].argmax())
            if best != d:
                return out + [best]
        else:
            qj = q[j] if q is not None else torch.nn.functional.one_hot(torch.tensor(d), p.shape[-1]).float()
            if torch.rand((), generator=generator) >= min(1.0, float(p[j, d] / qj[d])):
                rest = (p[j] - qj).clamp(min=0)
                return out + [int(torch.multinomial(rest / rest.sum(), 1, generator=generator))]
        out.append(d)
    last = p[len(drafts)]
    return out + [int(last.argmax()) if greedy else int(torch.multinomial(last, 1, generator=generator))]


class _Drafter:
    """Proposes drafts: by prompt lookup, or with a draft model that keeps a cache of its own."""

    def __init__(self, draft, target: torch.nn.Module, prompt: list[int], k: int, ngram: int, max_len: int,
                 temperature: float, top_k: int | None, generator: torch.Generator | None) -> None:
        self.model = None if isinstance(draft, str) else draft
        self.k, self.ngram, self.temperature, self.top_k, self.generator = k, ngram, temperature, top_k, generator
        if self.model is not None:
            self.cache = KVCache.for_model(self.model, max_len=max_len)
            self.cache_len = 0                                      # tokens of the sequence in the draft's cache

    def propose(self, tokens: list[int], room: int) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``min(k, room)`` drafts after ``tokens``, and the drafter's distributions (``None``:
        certain drafts)."""
        k = min(self.k, room)
        if k <= 0:
            return [], None
        if self.model is None:
            return lookup_draft(tokens, k, self.ngram), None
        return self._run_model(tokens, k)

    @torch.no_grad()
    def _run_model(self, tokens: list[int], k: int) -> tuple[list[int], torch.Tensor]:
        self.cache.truncate(self.cache_len)                        # back to what agrees with `tokens`
        feed, drafts, dists = tokens[self.cache_len:], [], []
        for _ in range(k):
            logits = self.model(torch.tensor([feed], device=self.model.device), self.cache, last_only=True)[0, -1]
            dist = self._distribution(logits)
            token = int(dist.argmax()) if self.temperature == 0 else int(torch.multinomial(dist, 1,
                                                                                           generator=self.generator))
            drafts.append(token)
            dists.append(dist)
            feed = [token]
        self.cache_len = len(tokens) + max(k - 1, 0)               # the last draft was never fed
        return drafts, torch.stack(dists) if dists else torch.empty(0)

    def _distribution(self, logits: torch.Tensor) -> torch.Tensor:
        if self.temperature == 0:
            return logits.float().cpu()
        return probabilities(logits, self.temperature, self.top_k).cpu()

    def rolled_back(self, kept: int) -> None:
        """The model kept ``kept`` tokens of the sequence: the draft cache may keep no more."""
        if self.model is not None:
            self.cache_len = min(self.cache_len, kept)


def _check_draft(draft, model: torch.nn.Module) -> None:
    if isinstance(draft, str):
        if draft not in DRAFTS:
            raise ValueError(f"unknown draft {draft!r}: use one of {', '.join(map(repr, DRAFTS))}, or a draft model "
                             f"(a kvlib.Decoder of the same vocabulary)")
        return
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config"):
        raise TypeError(f"draft must be 'prompt_lookup' or a kvlib.Decoder, got {type(draft).__name__}")
    if draft.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"the draft model's vocabulary has {draft.config.vocab_size:,} tokens, the model's "
                         f"{model.config.vocab_size:,}: a draft must share the model's vocabulary")
    if next(draft.parameters()).device != next(model.parameters()).device:
        raise ValueError(f"the draft model is on {next(draft.parameters()).device}, the model on "
                         f"{next(model.parameters()).device}: put both on one device")


@torch.no_grad()
def generate(model: torch.nn.Module, prompt_ids, max_new_tokens: int, *, draft="prompt_lookup", k: int = 4,
             ngram: int = 3, temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, stop_token: int | None = None) -> Generation:
    """Continue ``prompt_ids`` by up to ``max_new_tokens`` tokens, speculatively (see the module's
    docstring). ``draft``: ``"prompt_lookup"`` (``ngram`` tokens matched) or a draft model (another
    :class:`kvlib.Decoder`, or the same weights in another format, of the same vocabulary and on
    the same device); ``k`` drafts at most per step. Returns what :func:`kvlib.generate` returns,
    a :class:`kvlib.Generation`, whose records (one per verify step) also say how many tokens were
    drafted and how many accepted. Stops after ``stop_token`` (included)."""
    non_negative_int("max_new_tokens", max_new_tokens)
    positive_int("k", k)
    positive_int("ngram", ngram)
    check_sampling(temperature, top_k)
    _check_draft(draft, model)
    cfg = model.config
    prompt = check_prompt("prompt_ids", prompt_ids, cfg.vocab_size, cfg.max_seq_len, max_new_tokens, stop_token)
    run = _Run(model, prompt, max_new_tokens, temperature, top_k, generator, stop_token)
    run.drafter = _Drafter(draft, model, prompt, k, ngram, len(prompt) + max_new_tokens, temperature, top_k,
                           generator)
    return run.to_end()


class _Run:
    """One speculative generation: the model's cache, the tokens so far, the records."""

    def __init__(self, model, prompt, max_new, temperature, top_k, generator, stop_token) -> None:
        self.model, self.max_new, self.temperature, self.top_k = model, max_new, temperature, top_k
        self.generator, self.stop = generator, stop_token
        self.tokens, self.new, self.records = list(prompt), Generation(), []
        self.cache = KVCache.for_model(model, max_len=len(prompt) + max_new)   # drafts never reach past the end
        self.device = next(model.parameters()).device

    def to_end(self) -> Generation:
        if self.max_new:
            with Stopwatch(self.device) as watch:                   # the prefill: the first token
                logits = self.model(torch.tensor([self.tokens], device=self.device), self.cache, last_only=True)
                first = int(sample(logits[0, -1], self.temperature, self.top_k, self.generator))
            self.records.append(StepRecord(0, len(self.tokens), len(self.tokens), watch.seconds))
            self.keep([first])
        while len(self.new) < self.max_new and not self.stopped():
            self.step()
        self.new.records = self.records
        return self.new

    def stopped(self) -> bool:
        return self.stop is not None and bool(self.new) and self.new[-1] == self.stop

    def step(self) -> None:
        """Draft, verify in one forward pass, keep the accepted tokens, roll the cache back."""
        with Stopwatch(self.device) as watch:
            drafts, q = self.drafter.propose(self.tokens, self.max_new - len(self.new) - 1)
            held = self.cache.pos                                    # every token but the last is in the cache
            feed = torch.tensor([self.tokens[held:] + drafts], device=self.device)
            logits = self.model(feed, self.cache)[0, -len(drafts) - 1:]      # (drafts + 1, vocab)
            greedy = self.temperature == 0
            p = logits.float().cpu() if greedy else probabilities(logits, self.temperature, self.top_k).cpu()
            kept = accept(drafts, p, q, self.generator, greedy)
            self.cache.truncate(held + len(kept))                   # the last kept token is fed next step
        self.records.append(StepRecord(len(self.records), len(self.tokens), feed.shape[1], watch.seconds,
                                       drafted=len(drafts), accepted=len(kept) - 1, draft=tuple(drafts)))
        self.keep(kept)

    def keep(self, kept: list[int]) -> None:
        for token in kept:
            if len(self.new) == self.max_new or self.stopped():
                break
            self.new.append(token)
            self.tokens.append(token)
        self.drafter_kept()

    def drafter_kept(self) -> None:
        drafter = getattr(self, "drafter", None)
        if drafter is not None:
            drafter.rolled_back(len(self.tokens) - 1)
