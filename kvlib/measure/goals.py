"""Issue 16's performance goals, as one benchmark run measured them (:mod:`kvlib.measure.bench`)."""
from __future__ import annotations

__all__ = ["goals"]


def goals(rows: list, batched_rows: list, format_floors: dict) -> list[dict]:
    """Issue 16's goals, each as measured in this run: the value, the target, and whether it is met
    (``None`` where this run could not measure it: no peer, no batched run)."""
    peer = next((r for r in rows if r.impl.library == "llama.cpp"), None)
    kvlib_cached = [r for r in rows if r.impl.library == "kvlib" and r.impl.cache]
    fp32 = next(r for r in kvlib_cached if r.impl.format == "float32" and not r.impl.compiled)

    def batched(name_prefix: str, size: int):
        return max((b.decode_tokens_per_s for b in batched_rows if b.name.startswith(name_prefix) and b.batch == size),
                   default=None)

    peer32, kv32 = batched("llama.cpp", 32), batched("kvlib", 32)
    fastest = min(kvlib_cached, key=lambda r: r.decode_step_seconds)
    fastest_prefill = min(kvlib_cached, key=lambda r: r.prefill_seconds)
    measured = [
        ("batch-1 decode, kvlib's fastest / llama.cpp", 1.0,
         peer and peer.decode_step_seconds / fastest.decode_step_seconds),
        ("batched decode at 32 sequences, kvlib's fastest / llama.cpp", 1.5, kv32 and peer32 and kv32 / peer32),
        ("prefill, kvlib's fastest / llama.cpp", 2.0, peer and peer.prefill_seconds / fastest_prefill.prefill_seconds),
        ("float32 eager decode, share of its weight-read floor", 0.9,
         format_floors["float32"][1] / fp32.decode_step_seconds),
    ]
    return [{"goal": goal, "target": target, "value": value, "met": None if value is None else value >= target}
            for goal, target, value in measured]
