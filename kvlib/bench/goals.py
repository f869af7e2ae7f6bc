"""The performance goals (issues 16 and 27), as one benchmark run measured them (:mod:`kvlib.bench.run`).

Each goal is a dict: ``goal``, ``target``, ``value`` (``None`` where the run could not measure
it: no peer, no compiled step), ``met``, ``unit`` (``"x"`` a ratio, ``"%"`` a share, ``"s"``
seconds), ``at_most`` (the value must stay under the target), and where it is not met,
``short_by`` (how far, in milliseconds per step where it is a step) and ``held_by`` (where that
step's time goes, from the run's profile of it).
"""
from __future__ import annotations

__all__ = ["goals", "held_by"]


def held_by(profile: dict | None, allowed_ms: float | None = None) -> str | None:
    """Where one profiled decode step's time goes: matrix products, attention, and the rest
    (the fused or small operators and the Python between them), in milliseconds. With
    ``allowed_ms`` (the step the goal allows), it says when the matrix products and attention
    alone take longer than that: then no saving between the operators can meet the goal."""
    if not profile:
        return None
    wall, mm, att = profile["wall_ms_per_step"], profile["matmul_ms"], profile["attention_ms"]
    text = (f"of its {wall:.1f} ms step ({profile['label']}): matrix products {mm:.1f} ms, attention {att:.1f} ms, "
            f"the rest {max(wall - mm - att, 0.0):.1f} ms")
    if allowed_ms is not None and mm + att > allowed_ms:
        text += (f"; the products and attention alone take more than the {allowed_ms:.1f} ms the goal allows, so "
                 "it needs faster kernels, not less time between them")
    return text


def _goal(goal: str, target: float, value: float | None, unit: str = "x", at_most: bool = False,
          short_by: str | None = None, held: str | None = None) -> dict:
    met = None if value is None else (value <= target if at_most else value >= target)
    return {"goal": goal, "target": target, "value": value, "met": met, "unit": unit, "at_most": at_most,
            "short_by": None if met in (None, True) else short_by, "held_by": None if met in (None, True) else held}


def goals(rows: list, batched_rows: list, format_floors: dict, new_process_seconds: float | None = None,
          profiles: dict | None = None) -> list[dict]:
    """Every goal as measured in this run. ``rows`` and ``batched_rows`` are the bench's rows,
    ``new_process_seconds`` a new process's first compiled call (section 5's model), ``profiles``
    the run's step profiles by format (``"fastest"``, ``"native 4-bit"``, ``"float32"``)."""
    profiles = profiles or {}
    peer = next((r for r in rows if r.impl.library == "llama.cpp"), None)
    cached = [r for r in rows if r.impl.library == "kvlib" and r.impl.cache]
    eager = {r.impl.format: r for r in cached if not r.impl.compiled}
    fastest = min(cached, key=lambda r: r.decode_step_seconds)
    fastest_prefill = min(cached, key=lambda r: r.prefill_seconds)

    def batched(prefix: str, size: int):
        found = [b for b in batched_rows if b.name.startswith(prefix) and b.batch == size]
        return max(found, key=lambda b: b.decode_tokens_per_s) if found else None

    peer32, kv32 = batched("llama.cpp", 32), batched("kvlib", 32)
    step_ms = 1e3 * fastest.decode_step_seconds
    out = [
        _goal("batch-1 decode after the prompt, kvlib's fastest / llama.cpp", 1.0,
              peer and peer.decode_step_seconds / fastest.decode_step_seconds,
              short_by=peer and f"{step_ms - 1e3 * peer.decode_step_seconds:.1f} ms per step",
              held=held_by(profiles.get("fastest"), peer and 1e3 * peer.decode_step_seconds)),
        _goal("batched decode of 32 sequences, kvlib's fastest / llama.cpp", 1.5,
              kv32 and peer32 and kv32.decode_tokens_per_s / peer32.decode_tokens_per_s,
              short_by=kv32 and peer32 and
              f"{1e3 * 32 * (1 / kv32.decode_tokens_per_s - 1 / (1.5 * peer32.decode_tokens_per_s)):.1f} ms per step",
              held=kv32 and f"best kvlib row: {kv32.name}"),
        _goal("prefill, kvlib's fastest / llama.cpp", 2.0,
              peer and peer.prefill_seconds / fastest_prefill.prefill_seconds),
    ]
    compiled = [r for r in cached if r.impl.compiled and r.impl.format in eager]
    if compiled:
        same = [r.impl.format for r in compiled if r.tokens == eager[r.impl.format].tokens]
        differ = [r.impl.label for r in compiled if r.impl.format not in same]
        out.append(_goal("compiled paths writing their format's eager greedy tokens", 1.0, len(same) / len(compiled),
                         unit="%", short_by=", ".join(differ)))
    native, fp32 = eager.get("native 4-bit"), eager["float32"]
    if native is not None:
        gap = 1e3 * (native.decode_step_seconds - fp32.decode_step_seconds / 2.5)
        out.append(_goal("kvlib.generate decode, native 4-bit / float32, default options", 2.5,
                         fp32.decode_step_seconds / native.decode_step_seconds, short_by=f"{gap:.1f} ms per step",
                         held=held_by(profiles.get("native 4-bit"), 1e3 * fp32.decode_step_seconds / 2.5)))
    out.append(_goal("a new process's first compiled step (section 5's model), seconds", 15.0, new_process_seconds,
                     unit="s", at_most=True, short_by=new_process_seconds and f"{new_process_seconds - 15:.1f} s"))
    floor = format_floors["float32"][1]
    out.append(_goal("float32 eager decode, share of its weight-read floor", 0.9, floor / fp32.decode_step_seconds,
                     unit="%", short_by=f"{1e3 * (fp32.decode_step_seconds - floor / 0.9):.1f} ms per step",
                     held=held_by(profiles.get("float32"))))
    return out
