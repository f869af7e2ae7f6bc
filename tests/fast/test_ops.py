"""kvlib's operators (kvlib.ops): each declared once, registered one way, checked by PyTorch's
``opcheck``; the profile's parts and the compiled code's version derived from the declarations;
and bad sizes raise a Python error that names the argument, never end the process."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kvlib import ops
from kvlib.fast import kernels
from kvlib.fast.gguf_linear import q8_0_blocks
from kvlib.quant.formats import pack_q4_1 as q4_1_blocks

ROOT = Path(kernels.__file__).resolve().parents[1]                 # kvlib/
OURS = kernels.kernels_missing() is None


def _samples() -> dict[str, list[tuple]]:
    """Arguments to call each tensor operator with: a few shapes, float32 and bfloat16 where taken."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (24, 64), generator=g, dtype=torch.uint8)
    d, m = torch.rand(24, 2, generator=g).half().float(), torch.randn(24, 2, generator=g).half().float()
    w4, w8 = q4_1_blocks(q, d, m), q8_0_blocks(torch.randn(24, 64, generator=g))[0]
    x = torch.randn(3, 64, generator=g)
    panels = torch.ops.kvlib_cpu.panel_pack(torch.randn(40, 64, generator=g)) if OURS else None
    pool = torch.randn(10, 1, 16, generator=g)
    context = torch.tensor([[0, 3, 5, 7], [1, 2, 4, 6]])
    return {
        "kvlib::matvec": [(torch.randn(5, 8, generator=g), torch.randn(8, generator=g))],
        "kvlib_cpu::q4_1_mm": [(x, w4, 24), (x[None].bfloat16(), w4, 24), (x[:1], w4, 24)],
        "kvlib_cpu::q8_0_mm": [(x, w8, 24), (x.bfloat16(), w8, 24)],
        "kvlib_cpu::quantize_rows": [(x,)],
        "kvlib_cpu::panel_pack": [(torch.randn(40, 64, generator=g),), (torch.randn(16, 8, generator=g),)],
        "kvlib_cpu::panel_mm": [(x, panels, 40), (x[:1], panels, 33)],
        "kvlib_cpu::paged_attention": [(torch.randn(3, 2, 16, generator=g), pool, pool.clone(), context,
                                        torch.tensor([4, 2, 3]), torch.tensor([0, 1, 1]), 0.25)],
    }


def test_every_operator_kvlib_registers_is_declared_in_one_place():
    """No module but kvlib.ops defines an operator or its fake; every C++ ``m.impl`` and every
    ``ops.implement`` names a declared one; every declared one is implemented somewhere."""
    defining = re.compile(r"custom_op\(|torch\.library\.Library\(|register_fake\(|\.define\(|m\.def\(|TORCH_LIBRARY\(")
    stray = [str(p.relative_to(ROOT)) for p in [*ROOT.rglob("*.py"), *ROOT.rglob("*.cpp")]
             if p.name != "ops.py" and defining.search(p.read_text())]
    assert stray == [], f"operators defined outside kvlib/ops.py: {stray}"
    implemented = {f"kvlib_cpu::{n}" for p in ROOT.rglob("*.cpp") for n in re.findall(r'm\.impl\("(\w+)"', p.read_text())}
    implemented |= {n for p in ROOT.rglob("*.py") for n in re.findall(r'ops\.implement\("([\w:]+)"', p.read_text())}
    assert implemented == set(ops.OPS)
    for op in ops.OPS.values():                                   # each says truly where its code lives
        assert op.name.split("::")[1] in (ROOT.parent / op.code).read_text(), op


def test_the_profiles_parts_name_every_kvlib_operator_that_multiplies_or_attends():
    from kvlib.measure.experiments import STEP_PARTS

    for op in ops.OPS.values():
        if op.part != "other operators":
            assert op.name in STEP_PARTS[op.part], op.name
    assert "kvlib::packed_linear" in STEP_PARTS["matrix products"]            # the five a hand-kept list missed
    assert {"kvlib_cpu::panel_mm"} < set(STEP_PARTS["matrix products"])
    assert {"kvlib::unified_attention", "kvlib_cpu::paged_attention"} <= set(STEP_PARTS["attention"])


def test_a_changed_fake_is_a_new_version_of_the_operators(monkeypatch, tmp_path):
    """torch's cache knows kvlib's operators by name only: code compiled against an operator's old
    fake (its result's shape and layout) must not be loaded once the fake changes."""
    import kvlib.compiled as kc

    copy = tmp_path / "ops.py"
    copy.write_text(Path(ops.__file__).read_text())
    monkeypatch.setattr(ops, "__file__", str(copy))
    before = kc.ops_tag()
    assert before == kc.ops_tag() and before.startswith("ops-")
    copy.write_text(copy.read_text().replace("return attention_room(q)", "return q.new_empty(q.shape)"))
    assert kc.ops_tag() != before


def test_a_kernel_not_loaded_is_a_python_error_that_says_so():
    """Declared but not loaded (a process that never called kernels.load()), a C++ operator raises
    a Python error naming it; and only the Python operators take an implementation from Python."""
    script = ("import torch, kvlib.ops\n"
              "try:\n    torch.ops.kvlib_cpu.q4_1_mm(torch.randn(1, 32), torch.zeros(1, 20, dtype=torch.uint8), 1)\n"
              "except NotImplementedError as err:\n    print('raised:', str(err).splitlines()[0])\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "raised: Could not run 'kvlib_cpu::q4_1_mm'" in run.stdout, run.stderr[-2000:]
    with pytest.raises(KeyError, match="not one of kvlib's Python operators"):
        ops.implement("kvlib_cpu::q4_1_mm", lambda x, w, n: x)


@pytest.mark.skipif(not OURS, reason=f"kvlib's CPU kernels cannot be built here: {kernels.kernels_missing()}")
@pytest.mark.parametrize("name", [n for n, op in ops.OPS.items() if "Tensor" in op.schema and n not in
                                  ("kvlib::packed_linear", "kvlib::unified_attention")])
def test_opcheck_passes_for_every_operator(name):
    """``torch.library.opcheck``: the schema, the fake against the real result (shape, dtype,
    strides), and the dispatcher's checks. (packed_linear and unified_attention need a packed
    weight and a pool in context: tests/fast/test_packed.py and tests/serve/test_compiled.py.)"""
    assert kernels.load()
    for args in _samples()[name]:
        torch.library.opcheck(ops.OPS[name].packet.default, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


# Edge shapes, in a process of their own: each call must return or raise a Python error.
EDGE_SCRIPT = textwrap.dedent('''
    import sys, torch
    from hypothesis import given, settings, strategies as st
    from kvlib.fast import kernels
    assert kernels.load(), kernels.kernels_missing()
    K = torch.ops.kvlib_cpu
    sizes = st.integers(0, 70)

    def tolerant(call):
        try:
            call()
        except (RuntimeError, ValueError, IndexError, ZeroDivisionError) as err:
            assert str(err), "an error with no message"

    @settings(max_examples=150, deadline=None, database=None)
    @given(sizes, sizes, sizes, st.sampled_from([0, 20, 34, 40]), st.integers(0, 3))
    def blocks(rows, k, n, width, offset):
        x = torch.randn(rows, k)
        w = torch.zeros(n * width + offset, dtype=torch.uint8)[offset:].reshape(n, width) if n else \\
            torch.zeros(0, width, dtype=torch.uint8)
        tolerant(lambda: K.q4_1_mm(x, w, n))
        tolerant(lambda: K.q8_0_mm(x, w, n))
        tolerant(lambda: K.quantize_rows(x))

    @settings(max_examples=150, deadline=None, database=None)
    @given(sizes, sizes, sizes, sizes)
    def panels(rows, inp, out, n):
        tolerant(lambda: K.panel_mm(torch.randn(rows, inp), K.panel_pack(torch.randn(out, inp)), n))
        tolerant(lambda: K.panel_mm(torch.randn(rows, inp), torch.zeros(out, inp, 16), n))

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4), st.integers(0, 5), st.integers(0, 5),
           st.integers(0, 6), st.integers(-1, 6))
    def attention(n, heads, kv_heads, dim, slots, k_len, fill):
        q, pool = torch.randn(n, heads, dim), torch.randn(slots, kv_heads, dim)
        context = torch.full((max(n, 1), k_len), fill, dtype=torch.long)
        tolerant(lambda: K.paged_attention(q, pool, pool, context, torch.full((n,), fill, dtype=torch.long),
                                           torch.zeros(n, dtype=torch.long), 1.0))

    blocks(); panels(); attention()
    print("every edge shape returned or raised")
''')


@pytest.mark.skipif(not OURS, reason=f"kvlib's CPU kernels cannot be built here: {kernels.kernels_missing()}")
def test_edge_shapes_raise_python_errors_never_end_the_process():
    """Zero sizes, mismatched and misaligned weights, no kv heads: before these checks, ``k == 0``
    and ``in == 0`` ended the process with SIGFPE (a notebook's kernel died)."""
    run = subprocess.run([sys.executable, "-c", EDGE_SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"exit {run.returncode} (negative: killed by signal {-run.returncode}):\n{run.stderr[-3000:]}"
    assert "every edge shape returned or raised" in run.stdout


@pytest.mark.skipif(not OURS, reason=f"kvlib's CPU kernels cannot be built here: {kernels.kernels_missing()}")
@pytest.mark.parametrize("call, message", [
    (lambda K: K.q4_1_mm(torch.randn(2, 0), torch.zeros(3, 0, dtype=torch.uint8), 3), "positive multiple of 32"),
    (lambda K: K.q8_0_mm(torch.randn(2, 32), torch.zeros(35, dtype=torch.uint8)[1:].reshape(1, 34), 1),
     "odd byte"),
    (lambda K: K.panel_mm(torch.randn(2, 0), torch.zeros(1, 0, 16), 4), "no inputs"),
    (lambda K: K.paged_attention(torch.randn(1, 2, 8), torch.randn(4, 0, 8), torch.randn(4, 0, 8),
                                 torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long),
                                 torch.zeros(1, dtype=torch.long), 1.0), "at least one kv head"),
])
def test_each_edge_says_what_is_wrong(call, message):
    assert kernels.load()
    with pytest.raises(RuntimeError, match=message):
        call(torch.ops.kvlib_cpu)
