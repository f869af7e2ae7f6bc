"""kvlib's layout and the contracts between its parts: the import direction, no reaching into
another module's private names, small modules, a quick side-effect-free ``import kvlib``,
one argument-check module, one layer-cache contract, one forward pass."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kvlib
from kvlib import Config, Decoder
from kvlib.cache import (HalfKVCache, Int8KVCache, KVCache, LayerCache, SlidingWindowKVCache)
from kvlib.checks import non_negative_int, optional_positive_int, positive_int

ROOT = Path(__file__).resolve().parent.parent / "kvlib"
MODULES = sorted(p for p in ROOT.rglob("*.py"))
# What a learner reads: the decoder at the top and the subjects it is built from. None of it imports
# the apparatus (measuring, widgets, exercises) or the benchmark's wing: `kvlib.fast` (the fast
# path's speed knobs) and `kvlib.bench` (the benchmark), on top of everything.
LESSON = ["config.py", "ops.py", "rope.py", "attention.py", "model.py", "generate.py", "compiled.py", "checks.py",
          "clock.py", "device.py", "paths.py", "rounding.py", "speculative.py", "cache", "serve", "quant", "smollm2", "data"]
APPARATUS = ("kvlib.measure", "kvlib.widgets", "kvlib.exercises", "kvlib.fast", "kvlib.bench")
# The layers, lowest first: a unit may import its own layer and those below, never one above.
LAYERS = [
    {"kvlib.checks", "kvlib.clock", "kvlib.device", "kvlib.paths", "kvlib.config", "kvlib.rounding", "kvlib.rope", "kvlib.data",
     "kvlib.ops"},
    {"kvlib.attention"},
    {"kvlib.cache"},
    {"kvlib.model", "kvlib.compiled"},
    {"kvlib.generate"},
    {"kvlib.quant", "kvlib.serve", "kvlib.smollm2", "kvlib.speculative"},
    {"kvlib.measure"},
    {"kvlib.widgets", "kvlib.exercises", "kvlib.fast"},
    {"kvlib.bench"},                                 # the benchmark's wing, on top of everything
    {"kvlib"},
]
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module imported, names imported from it) for every import in the file, those
    inside functions included."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def _unit(module: str) -> str:
    """The unit a module belongs to: its subpackage (``kvlib.cache``), or itself at the top."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (ROOT / parts[1]).is_dir() else module


def _graph(unit=lambda m: m) -> dict[str, set[str]]:
    """Who imports whom inside kvlib (``from .x import y`` counts ``x.y`` when it is a module)."""
    names = {_module_name(p) for p in MODULES}
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        here = _module_name(path)
        for module, imported in _imports(path):
            targets = {f"{module}.{n}" for n in imported if f"{module}.{n}" in names} or {module}
            for target in targets & names:
                if unit(target) != unit(here):
                    graph.setdefault(unit(here), set()).add(unit(target))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph``, or ``None``."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    return next((c for n in sorted(graph) if n not in state and (c := visit(n, [n]))), None)


def test_lesson_code_never_imports_the_apparatus():
    lesson = [p for p in MODULES if any(p.relative_to(ROOT).as_posix().startswith(x) for x in LESSON)]
    assert len(lesson) >= 30
    for path in lesson:
        for module, _ in _imports(path):
            assert not module.startswith(APPARATUS), f"{path.relative_to(ROOT)} imports {module}"


@pytest.mark.parametrize("level", ["modules", "units"])
def test_no_import_cycle(level):
    """No cycle among modules, nor among units (subpackages, and the modules at the top), imports
    inside functions included."""
    graph = _graph() if level == "modules" else _graph(_unit)
    assert _cycle(graph) is None, f"an import cycle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_nothing_imports_upward():
    layer_of = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    units = {_unit(_module_name(p)) for p in MODULES}
    assert units <= set(layer_of), f"units without a layer: {sorted(units - set(layer_of))}"
    for unit, targets in _graph(_unit).items():
        for target in targets:
            assert layer_of[target] <= layer_of[unit], f"{unit} imports {target}, a layer above it"


def test_no_module_imports_a_private_name_of_another():
    for path in MODULES:
        for module, names in _imports(path):
            if module.startswith("kvlib"):
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{path.relative_to(ROOT)} imports {private} from {module}"


def test_every_function_is_short_enough_to_read_at_once():
    long = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions longer than {MAX_FUNCTION_LINES} lines: {long}"


def test_import_kvlib_is_quick_and_loads_nothing_heavy():
    code = ("import sys, time; t = time.perf_counter(); import kvlib; dt = time.perf_counter() - t; "
            "heavy = [m for m in ('gguf', 'tokenizers', 'ipywidgets', 'matplotlib', 'transformers', "
            "'kvlib.measure', 'kvlib.widgets', 'kvlib.exercises', 'kvlib.smollm2', 'kvlib.serve', 'kvlib.fast', "
            "'kvlib.bench') if m in sys.modules]; "
            "print(heavy, dt)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent).stdout.split("]")
    assert out[0] == "[", f"import kvlib loaded {out[0]}]"
    assert float(out[1]) < 5.0          # torch itself takes most of it


INSTANCE_ATTRIBUTES = {"kvlib.KVCache.lengths"}     # set in __init__: no class attribute to find


def _resolves(name: str) -> bool:
    """Whether ``kvlib.a.b.C.d`` names a module and then attributes inside it."""
    import importlib
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_docstrings_name_only_what_exists():
    """A docstring's :mod:/:class:/:func: reference to kvlib names a module or object that exists
    (references go stale when code moves)."""
    import re
    stale = [f"{path.relative_to(ROOT)}: {m}" for path in MODULES
             for m in re.findall(r":(?:mod|class|func|meth|attr|data):`~?(kvlib(?:\.\w+)+)`", path.read_text(encoding="utf-8"))
             if m not in INSTANCE_ATTRIBUTES and not _resolves(m)]
    assert not stale, f"docstrings name what does not exist: {stale}"
    assert not _resolves("kvlib.flops") and _resolves("kvlib.measure.flops")     # the check can fail


def test_the_real_model_names_load_on_first_use():
    assert kvlib.load_smollm2 is kvlib.smollm2.load_smollm2
    assert kvlib.MODEL_SHAPES is kvlib.cache.MODEL_SHAPES
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        kvlib.nonsense


# ------------------------------------------------------------------- the argument checks

@pytest.mark.parametrize("bad", [0, -1, 1.0, 2.5, "3", None, True, False])
def test_positive_int_rejects(bad):
    with pytest.raises(ValueError, match=r"width must be a positive int, got"):
        positive_int("width", bad)


def test_checks_accept_integers_and_return_plain_ints():
    assert positive_int("n", np.int64(3)) == 3 and type(positive_int("n", np.int64(3))) is int
    assert non_negative_int("n", 0) == 0 and optional_positive_int("n", None) is None
    with pytest.raises(ValueError, match="non-negative"):
        non_negative_int("n", -1)


@pytest.mark.parametrize("field", ["n_layers", "vocab_size", "max_seq_len"])
def test_config_rejects_a_bool_as_a_count(field):
    with pytest.raises(ValueError, match=f"Config.{field} must be a positive int, got True"):
        Config(**{field: True})


def test_config_stores_plain_ints():
    c = Config(n_layers=np.int64(3))
    assert type(c.n_layers) is int and c == Config(n_layers=3) and hash(c) == hash(Config(n_layers=3))


# ------------------------------------------------------------------- the layer-cache contract

@pytest.mark.parametrize("make", [lambda m: KVCache.for_model(m, max_len=8),
                                  lambda m: SlidingWindowKVCache.for_model(m, window=4),
                                  lambda m: Int8KVCache.for_model(m, max_len=8),
                                  lambda m: HalfKVCache.for_model(m, max_len=8, storage=torch.float16)])
def test_every_cache_keeps_the_layer_contract(make):
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    cache = make(model)
    assert cache.dtype == model.dtype and len(cache.layers) == model.config.n_layers
    for layer in cache.layers:
        assert isinstance(layer, LayerCache)
        assert layer.window in (None, getattr(cache, "window", None))
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        model(ids, cache)
    assert cache.pos == 3 and cache.device == model.device and cache.nbytes > 0
    assert repr(cache).startswith(type(cache).__name__ + "(layers=2")


def test_one_validation_for_every_cache():
    for cls, args in [(KVCache, (2, 1, 2, 0, 8)), (SlidingWindowKVCache, (2, 1, 2, 0, 8)),
                      (Int8KVCache, (2, 1, 2, 0, 8)), (HalfKVCache, (2, 1, 2, 0, 8))]:
        field = "window" if cls is SlidingWindowKVCache else "max_len"
        with pytest.raises(ValueError, match=f"{cls.__name__}: {field} must be a positive int"):
            cls(*args)
    with pytest.raises(ValueError, match="batch must be a positive int, got True"):
        KVCache(2, True, 2, 4, 8)


def test_truncate_rewinds_without_touching_pos_directly():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    cache = KVCache.for_model(model, max_len=8)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4]]), cache)
        first = model(torch.tensor([[5]]), cache)
        cache.truncate(4)
        again = model(torch.tensor([[5]]), cache)
    assert cache.pos == 5 and torch.equal(first, again)
    with pytest.raises(ValueError, match="holds only 5"):
        cache.truncate(6)


# ------------------------------------------------------------------- one forward pass

def test_forward_is_check_then_run_then_advance():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    cache = KVCache.for_model(model, max_len=8)
    with torch.no_grad():
        ran = model.run(ids, 0, cache)
        assert cache.pos == 0                       # run does not move the cache on
        assert torch.equal(model(ids), ran)
    with pytest.raises(ValueError, match="vocabulary"):
        model.check_input(torch.tensor([[64]]))


def test_the_compiled_step_runs_the_models_own_forward_pass(monkeypatch):
    """The compiled path traces ``Decoder.run`` itself, so a change there reaches it."""
    from kvlib import compiled

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)        # no compiler: run the traced function
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    calls = []
    original = Decoder.run

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("last"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Decoder, "run", spy)
    cache = KVCache.for_model(model, max_len=8)
    with torch.no_grad():
        model(torch.tensor([[1, 2]]), cache)
        logits = compiled.CompiledDecodeStep(model)(torch.tensor([[3]]), cache)
    assert calls == [None, -1] and logits.shape == (1, 1, model.config.vocab_size) and cache.pos == 3


def test_rope_takes_one_position_per_token():
    """Rows at different positions rotate as if each were alone: one positions tensor, (batch, seq),
    and an int p is the shorthand for p, p + 1, ..."""
    rope = kvlib.rope.RotaryEmbedding(8, 32, 10_000.0)
    x = torch.randn(3, 2, 4, 8, generator=torch.Generator().manual_seed(0))     # (batch, heads, seq, head_dim)
    starts = [0, 5, 11]
    positions = torch.tensor(starts)[:, None] + torch.arange(4)                   # (batch, seq)
    together = rope(x, positions)
    for row, start in enumerate(starts):
        torch.testing.assert_close(together[row:row + 1], rope(x[row:row + 1], start), rtol=0, atol=0)
