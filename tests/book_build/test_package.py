"""kvlib installs whole: its wheel, in a fresh virtual environment, with nothing of this
repository on the path, loads the real model, generates, and runs a chapter notebook alone.

What a learner does without `make`: ``pip install kvlib`` (the base dependencies of
pyproject.toml must be enough to load SmolLM2 and generate), then ``pip install
"kvlib[notebooks]"`` (what a notebook needs in Jupyter) and run a chapter's notebook from a
folder of their own. The wheel is built from a copy of ``pyproject.toml``, ``LICENSE`` and ``kvlib/`` in
a temporary folder (so no ``build/`` or ``*.egg-info`` lands in the repository), and
installed with ``-c requirements.txt``: the constraints keep torch at the pinned 2.13.0,
which this machine has on disk, so pip never downloads a CUDA build of several GB.
Everything else comes from pip's cache or the package index.

The notebook is ``chapters/03_the_kv_cache.ipynb``, the smallest (a tiny model, no model
file, no widgets), copied alone into an empty folder and executed by nbconvert with a kernel
that runs the new environment's Python with ``-I`` (isolated: no current folder, no
``PYTHONPATH``, no user site-packages on the path). A cell appended to the copy reports where
``kvlib`` was imported from.

Slow (a few minutes: mostly pip unpacking torch); ``-m 'not slow'`` skips it, and so does
``KVLIB_SKIP_PACKAGE_TEST=1``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.package,
    pytest.mark.skipif(os.environ.get("KVLIB_SKIP_PACKAGE_TEST") == "1",
                       reason="KVLIB_SKIP_PACKAGE_TEST=1: the installed-wheel test is switched off"),
]

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "requirements.txt"
NOTEBOOK = REPO / "chapters" / "03_the_kv_cache.ipynb"
KERNEL = "kvlib-wheel"
MARK = "KVLIB-PACKAGE-CHECK "           # prefix of the lines the appended cell prints

# Run in the new environment: where kvlib comes from, and that its subpackages import.
CHECK_IMPORTS = """
import json, sys, sysconfig
import kvlib, kvlib.exercises, kvlib.measure, kvlib.widgets
print("{mark}" + json.dumps({{"kvlib": kvlib.__file__, "purelib": sysconfig.get_paths()["purelib"],
                             "prefix": sys.prefix, "path": sys.path}}))
"""


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would put the repository (or the
    .venv) on a Python path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV",
                        "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "IPYTHONDIR")}
    env.update(extra)
    return env


def _run(cmd: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or _env(), timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-6000:]}"
    return proc.stdout


def _pip_install(py: Path, requirement: str, cwd: Path) -> None:
    """``pip install requirement -c requirements.txt`` into the environment of ``py`` (``-s`` shows how long)."""
    start = time.perf_counter()
    _run([py, "-m", "pip", "install", "--progress-bar", "off", requirement, "-c", CONSTRAINTS],
         cwd=cwd, timeout=1200)
    seconds = time.perf_counter() - start
    print(f"pip install {Path(requirement).name}: {seconds:.0f} s")


def _report(output: str) -> dict:
    lines = [line[len(MARK):] for line in output.splitlines() if line.startswith(MARK)]
    assert len(lines) == 1, f"expected one {MARK!r} line, got:\n{output[-3000:]}"
    return json.loads(lines[0])


def _assert_installed_copy(report: dict, venv: Path) -> None:
    kvlib_file = Path(report["kvlib"]).resolve()
    assert kvlib_file.is_relative_to(Path(report["purelib"]).resolve()), report
    assert kvlib_file.is_relative_to(venv.resolve()), f"kvlib imported from {kvlib_file}, not from {venv}"
    assert not kvlib_file.is_relative_to(REPO), f"kvlib imported from the repository: {kvlib_file}"
    assert Path(report["prefix"]).resolve() == venv.resolve(), f"Python ran in {report['prefix']}, not in {venv}"
    on_path = [p for p in report["path"] if p and Path(p).resolve().is_relative_to(REPO)]
    assert not on_path, f"the repository is on the new environment's sys.path: {on_path}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """kvlib's wheel, built by this environment's pip from a copy of pyproject.toml, LICENSE and kvlib/."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "LICENSE"):                         # LICENSE: pyproject's license-files
        shutil.copy2(REPO / name, src)
    shutil.copytree(REPO / "kvlib", src / "kvlib", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", "."],
         cwd=src, timeout=300)
    (built,) = (tmp / "dist").glob("kvlib-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    """A fresh virtual environment with ``pip install <wheel>`` (the base dependencies only)."""
    root = tmp_path_factory.mktemp("venv") / "env"
    _run([sys.executable, "-m", "venv", root], cwd=root.parent, timeout=300)
    _pip_install(root / "bin" / "python", str(wheel), cwd=root.parent)
    yield root
    shutil.rmtree(root, ignore_errors=True)       # over a GB, mostly torch: not kept for pytest's last three runs


@pytest.fixture
def empty_dir(tmp_path) -> Path:
    folder = tmp_path / "alone"
    folder.mkdir()
    return folder


def test_the_base_install_loads_smollm2_and_generates(venv, empty_dir):
    """``pip install kvlib``, nothing else: import every subpackage, load SmolLM2, chat, generate;
    read the data files the notebooks read (the evaluation text, the appendix's benchmark run)."""
    from kvlib.smollm2.weights import ModelFileError, smollm2_path

    try:
        gguf = smollm2_path(download=False)
    except ModelFileError:
        pytest.skip("the SmolLM2 model file is not here (make model)")
    script = CHECK_IMPORTS.format(mark=MARK) + """
model, tok = kvlib.load_smollm2()
prompt = tok.encode_chat("What does a KV cache keep?")
new = kvlib.generate(model, prompt, 8, stop_token=tok.eos_id)   # the new token ids
print("generated:", repr(tok.decode(new)))
assert 1 <= len(new) <= 8 and all(0 <= t < model.config.vocab_size for t in new), new
from kvlib.data import evaluation_text, reference_bench          # the package's data files came along
assert len(evaluation_text()) > 20_000 and reference_bench()["rows"]
from kvlib.fast.kernels import HEADERS, SOURCES                  # and the kernels' source, to build them from
missing = [p.name for p in SOURCES + HEADERS if not p.exists()]
assert not missing, f"the package lacks the kernels' files {missing}"
"""
    out = _run([venv / "bin" / "python", "-I", "-c", script], cwd=empty_dir, timeout=600,
               env=_env(KVLIB_SMOLLM2_GGUF=str(gguf)))
    _assert_installed_copy(_report(out), venv)
    assert "generated:" in out


def test_the_notebooks_extra_runs_a_chapter_alone(venv, wheel, empty_dir):
    """``pip install "kvlib[notebooks]"``, then a chapter's notebook, copied alone into an
    empty folder, runs to the end on that environment's kernel, with no error."""
    _pip_install(venv / "bin" / "python", f"{wheel}[notebooks]", cwd=empty_dir)
    py = venv / "bin" / "python"
    # The kernel, registered inside the environment the way a learner would; then made isolated.
    _run([py, "-m", "ipykernel", "install", "--prefix", venv, "--name", KERNEL, "--display-name", "kvlib (wheel)"],
         cwd=empty_dir, timeout=120)
    spec_file = venv / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json"
    spec = json.loads(spec_file.read_text())
    assert Path(spec["argv"][0]).resolve() == py.resolve(), spec["argv"]
    spec["argv"].insert(1, "-I")
    spec_file.write_text(json.dumps(spec, indent=1))

    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "kvlib-package-check",
                        "metadata": {}, "outputs": [], "source": CHECK_IMPORTS.format(mark=MARK)})
    copy = empty_dir / NOTEBOOK.name
    copy.write_text(json.dumps(nb, indent=1), encoding="utf-8")

    # nbconvert (from this environment) only drives the kernel; every cell runs in the new one.
    start = time.perf_counter()
    _run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--output", "executed.ipynb",
          f"--ExecutePreprocessor.kernel_name={KERNEL}", "--ExecutePreprocessor.timeout=600", copy.name],
         cwd=empty_dir, timeout=900, env=_env(JUPYTER_PATH=str(venv / "share" / "jupyter"),
                                              IPYTHONDIR=str(empty_dir.parent / "ipython")))
    print(f"{NOTEBOOK.name} on the wheel's kernel: {time.perf_counter() - start:.0f} s")

    executed = json.loads((empty_dir / "executed.ipynb").read_text(encoding="utf-8"))
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o["output_type"] == "error"]
    assert not errors, f"{NOTEBOOK.name} raised: {errors[0]['ename']}: {errors[0]['evalue']}"
    printed = "".join("".join(o["text"]) if isinstance(o["text"], list) else o["text"]
                      for o in executed["cells"][-1]["outputs"] if o.get("name") == "stdout")
    _assert_installed_copy(_report(printed), venv)
