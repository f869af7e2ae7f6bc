"""One request as the serving engine sees it: its tokens, its blocks and how far its cache goes.

A :class:`Sequence` holds the prompt and the tokens generated so far, the ids of the KV
cache blocks that hold its keys and values (its *block table*, see :mod:`.block_manager`), and
``num_computed``, how many of its tokens already have their keys and values in those blocks.

The contract between the scheduler (:mod:`.plan`) and the runner: at each step a scheduled
sequence feeds ``tokens[num_computed : num_computed + n]`` (``n >= 1``); after the forward
pass ``num_computed += n``; once ``num_computed == num_tokens``, the logits of the last fed
token choose the next token, which :meth:`Sequence.append` adds. A decode step therefore
feeds one token, the last generated one, whose keys are not yet in the cache; a prefill
feeds several. A preempted sequence loses its blocks and starts again from
``num_computed = 0``: its prompt and the output so far are recomputed (vLLM's *recompute*
preemption), so its output is unchanged.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..checks import is_int, non_negative_int, positive_int
from ..generate import finished

__all__ = ["Status", "Sequence"]


class Status(enum.Enum):
    """Where a sequence stands: waiting to be admitted (again), running, or finished."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request being served. ``index`` is its place in the list of requests given to the
    engine; two sequences are equal only if they are the same object (so they can be dict keys).

    ``num_cached`` counts the prompt tokens whose blocks came from the prefix cache at the
    last admission (they are part of ``num_computed``, but were never computed for it).
    """

    index: int
    prompt: list[int]
    max_new_tokens: int
    stop_token: int | None = None
    arrival: float = 0.0
    output: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0
    status: Status = Status.WAITING
    final_blocks: list[int] = field(default_factory=list)   # its block table when it finished
    tokens: list[int] = field(init=False, repr=False)        # the prompt, then the output: one list, grown in place

    def __post_init__(self) -> None:
        non_negative_int("index", self.index)
        self.prompt = list(self.prompt)
        if not self.prompt or not all(is_int(t) and t >= 0 for t in self.prompt):
            raise ValueError(f"request {self.index}: prompt must be a non-empty list of token ids >= 0, "
                             f"got {self.prompt!r}")
        positive_int(f"request {self.index}: max_new_tokens", self.max_new_tokens)
        if self.stop_token is not None and not is_int(self.stop_token):
            raise ValueError(f"request {self.index}: stop_token must be a token id or None, got {self.stop_token!r}")
        self.output = list(self.output)
        self.tokens = self.prompt + self.output                  # (nano-vllm's token_ids): never rebuilt

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose keys and values are not in the cache yet: 1 for a decoding sequence."""
        return self.num_tokens - self.num_computed

    @property
    def done(self) -> bool:
        """It has written ``max_new_tokens`` tokens, or its last token is its stop token
        (:func:`kvlib.generate.finished`, the stop rule of every loop)."""
        return finished(self.output, self.max_new_tokens, self.stop_token)

    def append(self, token: int) -> None:
        """Add a generated token; the sequence becomes ``FINISHED`` if that makes it done.

        Called once ``num_computed == num_tokens``: the logits of the last fed token chose it.
        """
        if self.done:
            raise ValueError(f"request {self.index} is already done: it takes no more tokens")
        self.output.append(token)
        self.tokens.append(token)
        if self.done:
            self.status = Status.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence(index={self.index}, {self.status.value}, {len(self.prompt)} prompt + "
                f"{len(self.output)} output tokens, {self.num_computed} computed, blocks {self.block_table})")
