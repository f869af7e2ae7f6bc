"""The engine's compiled forward pass (``Engine(..., compile=True)``, :mod:`kvlib.serve.compiled`):
the same tokens as the eager pass on every workload, one compilation for prefill and decode steps
of every size, the pool reached through the forward context only, and a broken copy caught.

Compiling takes a while even for a tiny model, so one compiled engine pass per model is made for
the module (torch.compile keeps it) and every test reuses it."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlib.fast import pack
from kvlib.serve import Engine, Request, serve
from kvlib.serve import compiled as serve_compiled

from .test_engine import engine_kwargs, step_clock, workloads
from tiny_models import tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    return tiny_model(torch.float32)


def both(model, requests, **kwargs):
    eager = serve(model, requests, clock=step_clock(), **kwargs)
    compiled = serve(model, requests, clock=step_clock(), compile=True, **kwargs)
    return eager, compiled


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_compiled_steps_choose_the_eager_steps_tokens(model, data):
    requests = data.draw(workloads())
    eager, compiled = both(model, requests, **engine_kwargs(data.draw, requests))
    assert compiled.outputs == eager.outputs
    assert [s.work for s in compiled.timeline] == [s.work for s in eager.timeline]


def test_one_compilation_serves_prefill_and_decode_steps_of_every_size(model):
    from torch._dynamo.utils import counters

    requests = [Request(list(range(1, 12)), 6), Request(list(range(20, 27)), 9), Request([5, 6, 7], 4)]
    serve(model, requests, max_batch=3, block_size=4, compile=True)          # compiles (or already did)
    before = counters["stats"]["unique_graphs"]
    more = [Request(list(range(3, 3 + n)), 5 + n % 7) for n in (2, 9, 17, 30)]
    for kw in (dict(max_batch=4, block_size=2), dict(max_batch=2, block_size=8, prefill_chunk=3),
               dict(max_batch=4, block_size=4, prefix_caching=True)):
        serve(model, more + requests, compile=True, **kw)
    assert counters["stats"]["unique_graphs"] == before


def test_the_packed_model_compiles_with_its_products_as_operators():
    model = tiny_model(torch.float32, seed=1)
    fast = pack(model, fused=True)
    requests = [Request(list(range(1, 15)), 8), Request([9, 8, 7, 6], 12), Request(list(range(30, 40)), 5)]
    eager, compiled = both(fast, requests, max_batch=2, block_size=4)
    assert compiled.outputs == eager.outputs == serve(model, requests, max_batch=2, block_size=4).outputs
    assert len({t for out in eager.outputs for t in out}) > 3          # not one token repeated


def test_attention_outside_a_forward_context_says_what_is_missing():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="forward_context"):
        serve_compiled.unified_attention(q, q[:, :2], q[:, :2], 0)


def test_a_failing_compiler_gives_a_clear_error(model, monkeypatch):
    from torch._inductor.exc import InductorError

    def no_compiler(*args, **kwargs):
        raise InductorError(RuntimeError("Failed to find a C++ compiler"), "")

    monkeypatch.setattr(torch, "compile", lambda *args, **kwargs: no_compiler)
    engine = Engine(model, max_batch=2, compile=True)
    with pytest.raises(RuntimeError, match=r"forward pass .* C\+\+ compiler .* compile=False"):
        engine.serve([Request([1, 2, 3], 2)])


def test_an_operator_that_ignores_the_layer_is_caught(model, monkeypatch):
    """A broken copy: every layer's attention stored and read as layer 0's. The compiled pass must
    hand each layer its own index, or the tokens change (the eager pass is untouched)."""
    right = serve_compiled.PagedKV.attend
    monkeypatch.setattr(serve_compiled.PagedKV, "attend",
                        lambda self, layer, *args: right(self, 0, *args) if serve_compiled._CONTEXT else
                        right(self, layer, *args))
    requests = [Request(list(range(1, 12)), 8), Request(list(range(20, 31)), 8)]
    eager, compiled = both(model, requests, max_batch=2, block_size=4)
    assert compiled.outputs != eager.outputs
