"""The chapter's levers together: one serving scenario, the levers applied one after another.

A :class:`Scenario` is a published model (:data:`kvlib.cache.MODEL_SHAPES`), a machine (an
:class:`~kvlib.measure.roofline.Accelerator`: a reference GPU, or this machine measured by
:func:`measured_machine`), a number of users each at a context of some tokens, how many of
those tokens are a system prompt they all share, and the acceptance rate and number of drafts
assumed for speculative decoding. :func:`levers` applies the chapter's levers **cumulatively**,
one row each:

    (a) bfloat16 weights, a 16-bit cache as if every head kept its own keys and values;
    (b) + grouped-query attention (the model's own key/value heads);      section 6
    (c) + an 8-bit cache (int8 numbers, a float32 scale per vector);       section 6
    (d) + 4-bit weights (:data:`WEIGHT_FORMAT`, 5.0 bits per weight);     section 8
    (e) + prefix reuse: the shared prompt's cache held once for all;      section 9
    (f) + speculative decoding: ``k`` drafts, each accepted with ``α``;   section 10

Each row holds the bytes (weights, each user's own cache), the users that fit in the machine's
memory, the batch actually run (the users, or as many as fit), what one decode step of that batch
reads and computes, and what the roofline of a decode step (:mod:`kvlib.measure.roofline`,
sections 4 and 7) predicts for it. A verify step computes the model's logits at every one of its
``k + 1`` positions (the model's own token after the last accepted draft needs them), so its
arithmetic is ``k + 1`` tokens' in full, the output layer included.

Rows (a) to (c) hold 16-bit numbers (``dense_bits=16``: bfloat16, what a GPU or a CPU with bfloat16
arithmetic multiplies), or float32 with ``dense_bits=32``: what kvlib computes in on a CPU without
bfloat16 arithmetic (:func:`kvlib.device.bfloat16_is_fast`), where a bfloat16 weight is converted
before every product and a 16-bit row would price a path the machine does not run. These
are predictions, upper bounds: weights and cache only (no activations, no fragmentation), and
the machine at its published or measured peak. Real steps are slower.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..cache.model_shapes import MODEL_SHAPES, ModelShape
from ..cache.sizes import kv_bytes_per_token
from ..checks import non_negative_int, positive_int
from ..quant.formats import bits_per_weight
from .flops import step_flops
from .hardware import matmul_flops_per_second, memory_bandwidth
from .roofline import REFERENCE_ACCELERATORS, Accelerator, decode_knee, decode_step_seconds
from .speculation import tokens_per_step
from .timing import fmt_seconds

__all__ = ["Lever", "LEVERS", "ROOFLINE_SECTIONS", "WEIGHT_FORMAT", "WEIGHT_BITS", "FLOAT32_BASE", "cache_bits", "Scenario", "LeverRow", "levers",
           "best_lever", "scenario_notes", "measured_machine", "format_levers", "fmt_gb"]


@dataclass(frozen=True)
class Lever:
    """One lever of the chapter: its letter, what it changes, and the section that derived it
    (its number and its notebook, ``page``, without the extension)."""

    key: str
    name: str
    section: int
    page: str


LEVERS: tuple[Lever, ...] = (
    Lever("a", "bfloat16 weights, 16-bit cache, no GQA", 7, "07_batching"),
    Lever("b", "+ grouped-query attention", 6, "06_the_price_is_memory"),
    Lever("c", "+ an 8-bit cache", 6, "06_the_price_is_memory"),
    Lever("d", "+ 4-bit weights", 8, "08_quantization"),
    Lever("e", "+ prefix reuse", 9, "09_reusing_the_cache"),
    Lever("f", "+ speculative decoding", 10, "10_speculative_decoding"),
)
FLOAT32_BASE = Lever("a", "float32 weights and cache, no GQA", 7, "07_batching")   # row (a) with dense_bits=32
ROOFLINE_SECTIONS = ((4, "04_quadratic_versus_linear"), (7, "07_batching"))   # the step time and its bound (every row)

WEIGHT_FORMAT = "4-bit integers in groups of 32, each group with a 16-bit scale and a 16-bit zero (the model file's Q4_1)"
WEIGHT_BITS = bits_per_weight(4, 32, scale_bits=16, zero_bits=16)          # 5.0 bits per weight


def cache_bits(shape: ModelShape) -> float:
    """Bits per cached number of the 8-bit cache of section 6 (:class:`kvlib.cache.Int8KVCache`):
    an int8 number plus its share of the float32 scale kept for each vector of ``head_dim`` numbers."""
    return bits_per_weight(8, shape.head_dim, scale_bits=32)


@dataclass(frozen=True)
class Scenario:
    """What is served, where, and to whom.

    ``model``: a name of :data:`kvlib.cache.MODEL_SHAPES`; ``machine``: an :class:`Accelerator`
    (or the name of one of :data:`REFERENCE_ACCELERATORS`), whose ``memory_bytes`` holds the
    weights and the caches; ``users`` sequences decoding at once, each at ``context`` tokens, of
    which the first ``shared_prefix`` are a system prompt every user shares; speculative decoding
    drafts ``drafts`` tokens per step, each accepted with chance ``alpha`` (an assumption: a draft
    model's kind of figure; prompt lookup accepts in all-or-nothing runs, section 10).
    ``shared_read_once``: from prefix reuse on, a step reads the shared prefix's cache once for the
    whole batch, as cascade attention (vLLM) and FlashInfer's shared-prefix kernels do, instead of
    once per row (the default, what kvlib's engine and a plain paged kernel do). ``dense_bits``: the
    bits of a weight and of a cached number before the levers that shrink them: 16 (bfloat16, the
    default) or 32 (float32, for a CPU without bfloat16 arithmetic). Bad values raise a
    ``ValueError`` saying what to change.
    """

    model: str
    machine: Accelerator | str
    users: int
    context: int
    shared_prefix: int = 0
    alpha: float = 0.7
    drafts: int = 4
    shared_read_once: bool = False
    dense_bits: int = 16

    def __post_init__(self) -> None:
        if self.model not in MODEL_SHAPES:
            raise ValueError(f"unknown model {self.model!r}: choose one of {', '.join(MODEL_SHAPES)}")
        if isinstance(self.machine, str):
            if self.machine not in REFERENCE_ACCELERATORS:
                raise ValueError(f"unknown machine {self.machine!r}: pass an Accelerator (measured_machine() for "
                                 f"this one) or one of {', '.join(REFERENCE_ACCELERATORS)}")
            object.__setattr__(self, "machine", REFERENCE_ACCELERATORS[self.machine])
        if not isinstance(self.machine, Accelerator):
            raise TypeError(f"machine must be an Accelerator or a name, got {type(self.machine).__name__}")
        positive_int("users", self.users)
        positive_int("context", self.context)
        if non_negative_int("shared_prefix", self.shared_prefix) >= self.context:
            raise ValueError(f"shared_prefix={self.shared_prefix:,} must be smaller than context={self.context:,}: "
                             f"each user needs tokens of its own; lower the shared prefix or raise the context")
        if not (isinstance(self.alpha, (int, float)) and 0 <= self.alpha <= 1):
            raise ValueError(f"alpha is the chance that a draft is accepted: a number from 0 to 1, got {self.alpha!r}")
        positive_int("drafts", self.drafts)
        if self.dense_bits not in (16, 32):
            raise ValueError(f"dense_bits is 16 (bfloat16) or 32 (float32), got {self.dense_bits!r}")

    @property
    def shape(self) -> ModelShape:
        return MODEL_SHAPES[self.model]


@dataclass(frozen=True)
class LeverRow:
    """One lever applied (with every lever before it): the bytes it leaves, the users that fit,
    the batch run, and the roofline's prediction for that batch (``None`` when no user fits)."""

    lever: Lever
    weight_bits: float
    cache_bits: float                 # bits per cached number
    kv_heads: int
    weight_bytes: float
    shared_bytes: float               # the shared prompt's cache, held once for all users (0 without reuse)
    cache_bytes_per_user: float       # each user's own cache
    fit: int                          # users that fit beside the weights (and the shared prompt)
    batch: int                        # min(users, fit)
    tokens_per_step: float            # tokens each row writes per step (1, or the expected run with drafts)
    step_seconds: float | None
    knee: float                       # rows at which the step leaves the memory side (math.inf: never)
    flops_per_row: float = 0.0        # one row's arithmetic in a step (k + 1 tokens with drafts)
    read_weight_bytes: float = 0.0    # what a step reads once whatever the batch: the weights (and a shared prefix read once)
    read_cache_bytes_per_row: float = 0.0   # the cache each row of a step reads

    @property
    def step_bytes(self) -> float:
        """Bytes one decode step of ``batch`` rows reads: the weights once, each row's cache."""
        return self.read_weight_bytes + self.batch * self.read_cache_bytes_per_row

    @property
    def step_flops(self) -> float:
        """FLOPs of one decode step of ``batch`` rows."""
        return self.batch * self.flops_per_row

    @property
    def intensity(self) -> float:
        """The step's FLOPs per byte read: above the machine's ridge point (FLOP/s over bytes/s) the
        step is compute-bound, below it memory-bound (0 when no user fits)."""
        return self.step_flops / self.step_bytes if self.batch else 0.0

    @property
    def bound(self) -> str | None:
        """``"memory"`` or ``"compute"``: which side of the roofline the step is on."""
        return None if self.step_seconds is None else ("compute" if self.batch > self.knee else "memory")

    @property
    def tokens_per_second_per_user(self) -> float:
        return 0.0 if self.step_seconds is None else self.tokens_per_step / self.step_seconds

    @property
    def tokens_per_second(self) -> float:
        """Tokens per second of the whole batch."""
        return self.batch * self.tokens_per_second_per_user


def _row(s: Scenario, index: int) -> LeverRow:
    """Lever ``index`` of :data:`LEVERS` with every lever before it."""
    shape, machine = s.shape, s.machine
    cfg = shape.config if index >= 1 else dataclasses.replace(shape.config, n_kv_heads=shape.n_heads)
    bits = cache_bits(shape) if index >= 2 else float(s.dense_bits)
    per_token = kv_bytes_per_token(cfg, 1) * bits / 8                   # numbers per token × bytes per number
    w_bits = WEIGHT_BITS if index >= 3 else float(s.dense_bits)
    weights = shape.n_params * w_bits / 8
    shared = s.shared_prefix if index >= 4 else 0
    drafts = s.drafts if index >= 5 else 0
    own = (s.context - shared + drafts) * per_token                     # the drafts sit in the cache until verified
    room = machine.memory_bytes - weights - shared * per_token
    fit = max(0, math.floor(room / own))
    batch = min(s.users, fit)
    once = shared if s.shared_read_once else 0                          # read once a step, not once a row
    # a verify step needs the logits after every draft (the model's own token follows the last
    # accepted one), so its output layer runs at all k + 1 positions, not at the last alone
    flops = float(step_flops(shape.config, s.context + drafts, drafts + 1, last_only=not drafts).total)
    step = dict(weight_bytes=weights + once * per_token, flops_per_token=flops,
                cache_bytes_per_row=(s.context - once + drafts) * per_token,   # every row reads its (whole) cache
                flops_per_s=machine.flops_per_s, bytes_per_s=machine.bytes_per_s)
    lever = FLOAT32_BASE if index == 0 and s.dense_bits == 32 else LEVERS[index]
    return LeverRow(lever=lever, weight_bits=w_bits, cache_bits=bits, kv_heads=cfg.n_kv_heads,
                    weight_bytes=weights, shared_bytes=shared * per_token, cache_bytes_per_user=own, fit=fit,
                    batch=batch, tokens_per_step=tokens_per_step(s.alpha, drafts) if drafts else 1.0,
                    step_seconds=decode_step_seconds(batch, **step) if batch else None, knee=decode_knee(**step),
                    flops_per_row=flops, read_weight_bytes=step["weight_bytes"],
                    read_cache_bytes_per_row=step["cache_bytes_per_row"])


def levers(scenario: Scenario) -> list[LeverRow]:
    """The six rows of :data:`LEVERS` for ``scenario``, each lever added to those above it.

    Memory: the machine's ``memory_bytes`` holds the weights, the shared prompt's cache (once,
    from prefix reuse on) and each user's own cache; ``fit`` is the whole users that fit in what
    is left (0: not even one; then ``batch`` is 0 and the step ``None``). The step: the roofline
    of :func:`kvlib.measure.roofline.decode_step_seconds` for ``batch`` rows, each reading its
    whole cache (prefix reuse saves memory, not reading, unless ``shared_read_once``) and, with
    speculative decoding, verifying
    ``drafts + 1`` tokens (the logits of every one); tokens per step with drafts: :func:`kvlib.measure.speculation.tokens_per_step`.
    """
    if not isinstance(scenario, Scenario):
        raise TypeError(f"levers() takes a Scenario, got {type(scenario).__name__}")
    return [_row(scenario, i) for i in range(len(LEVERS))]


def best_lever(rows: list[LeverRow]) -> tuple[float, Lever]:
    """The lever of (b) to (e) that raised the tokens per second of ``rows`` (:func:`levers`) the
    most, added to those above it, and by what factor (``math.inf`` where the row above it ran no
    user and it runs some)."""
    def gain(a: LeverRow, b: LeverRow) -> float:
        if a.tokens_per_second:
            return b.tokens_per_second / a.tokens_per_second
        return math.inf if b.tokens_per_second else 1.0

    return max(((gain(a, b), b.lever) for a, b in zip(rows[:4], rows[1:5])), key=lambda g: g[0])


def scenario_notes(scenario: Scenario) -> list[str]:
    """What to keep in mind about ``scenario``'s numbers: a context past the model's, a sliding
    window not applied, a machine on which not even one user fits."""
    shape, notes = scenario.shape, []
    if scenario.context > shape.max_context:
        notes.append(f"{shape.name} was released for {shape.max_context:,} tokens: {scenario.context:,} is the "
                     f"arithmetic of its shapes, not a setting it supports")
    if shape.sliding_window:
        notes.append(f"{shape.name} attends to its last {shape.sliding_window:,} tokens only (section 6): a "
                     f"rolling cache would hold at most that many; not applied here")
    if levers(scenario)[-1].fit == 0:
        notes.append(f"even with every lever, not one user fits in {scenario.machine.name}'s memory")
    return notes


def measured_machine(memory_bytes: int, *, name: str = "this machine") -> Accelerator:
    """This machine as an :class:`Accelerator`: its memory bandwidth and dense float32 FLOP/s
    measured now (:func:`kvlib.measure.memory_bandwidth`, :func:`kvlib.measure.matmul_flops_per_second`,
    on :func:`kvlib.default_device`), with ``memory_bytes`` the memory you give the model."""
    non_negative_int("memory_bytes", memory_bytes)
    return Accelerator(name, matmul_flops_per_second(), memory_bandwidth(), memory_bytes,
                       f"measured on {name} by kvlib.measure.hardware (dense float32 matrix product; "
                       f"a sum over a large buffer); memory: a budget of {memory_bytes / 1e9:g} GB")


def fmt_gb(n: float) -> str:
    """Bytes in decimal units, as memory is sold: ``16.06 GB``, ``12.6 MB``."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def format_levers(rows: list[LeverRow], *, measured: bool = False) -> str:
    """The rows as a plain-text table. With ``measured``, the machine's figures were measured, so
    times and rates print in the forms the notebook tests replace (``12.3 ms``, ``45.6 tok/s``)
    and the bound, which differs between machines, is left out."""
    head = f"{'lever':<44} {'weights':>9} {'cache/user':>10} {'fit':>6} {'batch':>5} {'step':>9} " \
           f"{'per user':>13} {'in total':>14}" + ("" if measured else "  bound   section")
    lines = [head]
    for r in rows:
        if r.step_seconds is None:
            timing = f"{'no user fits':>44}"
        else:
            timing = (f"{fmt_seconds(r.step_seconds):>9} {r.tokens_per_second_per_user:>9.1f} tok/s "
                      f"{r.tokens_per_second:>10.0f} tok/s")
        tail = "" if measured else f"  {r.bound or '-':<7} {r.lever.section:>4}"
        lines.append(f"({r.lever.key}) {r.lever.name:<40} {fmt_gb(r.weight_bytes):>9} {fmt_gb(r.cache_bytes_per_user):>10} "
                     f"{r.fit:>6,} {r.batch:>5,} {timing}{tail}")
    return "\n".join(lines)
