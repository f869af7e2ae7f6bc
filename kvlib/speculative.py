"""Speculative decoding: guess several tokens cheaply, check them with the model in one step.

A cached decode step reads every weight to compute one token; a step over ``k + 1`` tokens reads
them once too, so where the step is memory-bound (on a GPU) checking ``k + 1`` tokens costs
little more than one. On a CPU it can cost noticeably more (section 10 measures it). Each step here:

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
from .generate import Generation, Sampler, Written, check_prompt, decode, probabilities

__all__ = ["generate", "lookup_draft", "accept", "Drafter", "SpeculativeStep", "DRAFTS"]

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


class Drafter:
    """Proposes drafts: by prompt lookup, or with a draft model that keeps a cache of its own."""

    def __init__(self, draft, k: int, ngram: int, max_len: int, sampler: Sampler) -> None:
        self.model = None if isinstance(draft, str) else draft
        self.k, self.ngram, self.sampler = k, ngram, sampler
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
            token = int(dist.argmax()) if self.sampler.temperature == 0 else int(
                torch.multinomial(dist, 1, generator=self.sampler.generator))
            drafts.append(token)
            dists.append(dist)
            feed = [token]
        self.cache_len = len(tokens) + max(k - 1, 0)               # the last draft was never fed
        return drafts, torch.stack(dists) if dists else torch.empty(0)

    def _distribution(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sampler.temperature == 0:
            return logits.float().cpu()
        return probabilities(logits, self.sampler.temperature, self.sampler.top_k).cpu()

    def rolled_back(self, kept: int) -> None:
        """The model kept ``kept`` tokens of the sequence: the draft cache may keep no more."""
        if self.model is not None:
            self.cache_len = min(self.cache_len, kept)


class SpeculativeStep:
    """A step of :func:`kvlib.generate.decode` for one sequence: draft, verify in one forward pass,
    keep the accepted drafts and the model's own token, roll the cache back past the rest."""

    def __init__(self, model: torch.nn.Module, drafter: Drafter, sampler: Sampler) -> None:
        self.model, self.drafter, self.sampler = model, drafter, sampler

    def __call__(self, texts: list[list[int]], cache: KVCache, room: int) -> Written:
        (tokens,) = texts                                           # one sequence
        drafts, q = self.drafter.propose(tokens, room)
        held = cache.pos                                            # every token but the last is in the cache
        feed = torch.tensor([tokens[held:] + drafts], device=cache.device)
        logits = self.model(feed, cache)[0, -len(drafts) - 1:]      # (drafts + 1, vocab): after each prefix
        greedy = self.sampler.temperature == 0
        p = logits.float().cpu() if greedy else probabilities(logits, self.sampler.temperature,
                                                               self.sampler.top_k).cpu()
        kept = accept(drafts, p, q, self.sampler.generator, greedy)
        cache.truncate(held + len(kept))                            # the last kept token is fed next step
        self.drafter.rolled_back(len(tokens) + len(kept) - 1)
        return Written([kept], [logits[:len(kept)]], feed.shape[1], len(drafts), len(kept) - 1, tuple(drafts))


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


def generate(model: torch.nn.Module, prompt_ids, max_new_tokens: int, *, draft="prompt_lookup", k: int = 4,
             ngram: int = 3, temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, stop_token: int | None = None,
             keep_logits: bool = False) -> Generation:
    """Continue ``prompt_ids`` by up to ``max_new_tokens`` tokens, speculatively (see the module's
    docstring). ``draft``: ``"prompt_lookup"`` (``ngram`` tokens matched) or a draft model (another
    :class:`kvlib.Decoder`, or the same weights in another format, of the same vocabulary and on
    the same device); ``k`` drafts at most per step. This is :func:`kvlib.generate`'s loop
    (:func:`kvlib.generate.decode`: the same prefill, stop rule and records) with a
    :class:`SpeculativeStep`; it returns a :class:`kvlib.Generation`, whose records (one per verify
    step) also say how many tokens were drafted and how many accepted. Stops after ``stop_token``
    (included)."""
    non_negative_int("max_new_tokens", max_new_tokens)
    positive_int("k", k)
    positive_int("ngram", ngram)
    sampler = Sampler(temperature, top_k, generator)             # (checks them)
    _check_draft(draft, model)
    cfg = model.config
    prompt = check_prompt("prompt_ids", prompt_ids, cfg.vocab_size, cfg.max_seq_len, max_new_tokens, stop_token)
    drafter = Drafter(draft, k, ngram, len(prompt) + max_new_tokens, sampler)
    (gen,) = decode(model, [prompt], max_new_tokens, sampler=sampler, stop_token=stop_token, keep_logits=keep_logits,
                    step=SpeculativeStep(model, drafter, sampler))
    return gen
