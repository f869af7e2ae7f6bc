"""make setup's PyTorch step (scripts/install_torch.py): the CPU build by default on Linux without
an NVIDIA GPU, a torch already at the pin left alone, PyTorch's CPU index first and pip's own
index as the fallback, and never another version than the pin. pip itself is replaced by a
recorder here: nothing is installed."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_torch)

PIN = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.MULTILINE).group(1)


@pytest.fixture
def pip(monkeypatch):
    """Record every pip call; ``pip.results`` (exit statuses, in order) and ``pip.after`` (the
    version pip leaves installed) are set by each test."""
    class Pip:
        calls: list[tuple[str, ...]] = []
        results: list[int] = []
        after: str | None = f"{PIN}+cpu"
        before: str | None = None
        uninstalled = False
        reachable = True

    state = Pip()
    state.calls, state.results = [], []

    def fake_install(*args):
        state.calls.append(args)
        return state.results.pop(0) if state.results else 0

    def fake_run(cmd, **kwargs):
        assert cmd[:4] == [sys.executable, "-m", "pip", "uninstall"], cmd
        state.uninstalled = True
    monkeypatch.setattr(install_torch, "pip_install", fake_install)
    monkeypatch.setattr(install_torch.subprocess, "run", fake_run)
    monkeypatch.setattr(install_torch, "index_reachable", lambda: state.reachable)
    monkeypatch.setattr(install_torch, "installed_version",
                        lambda: state.after if state.calls else state.before)
    return state


def _linux_without_gpu(monkeypatch):
    monkeypatch.setattr(install_torch.platform, "system", lambda: "Linux")
    monkeypatch.setattr(install_torch.shutil, "which", lambda name: None)


def test_the_pin_is_read_from_requirements(tmp_path):
    assert install_torch.pinned_version(ROOT / "requirements.txt") == PIN
    empty = tmp_path / "requirements.txt"
    empty.write_text("numpy==2.4.6\n")
    with pytest.raises(install_torch.SetupError, match="pins no torch version"):
        install_torch.pinned_version(empty)


@pytest.mark.parametrize("choice, system, nvidia, build", [
    ("auto", "Linux", False, "cpu"), ("auto", "Linux", True, "pypi"), ("auto", "Darwin", False, "pypi"),
    ("auto", "Windows", False, "pypi"), ("cpu", "Linux", True, "cpu"), ("cuda", "Linux", False, "pypi")])
def test_which_build(choice, system, nvidia, build):
    assert install_torch.build_for(choice, system, nvidia) == build


def test_an_unknown_choice_is_refused():
    with pytest.raises(install_torch.SetupError, match="TORCH must be one of auto, cpu, cuda, got 'gpu'"):
        install_torch.build_for("gpu")


@pytest.mark.parametrize("have", [PIN, f"{PIN}+cpu", f"{PIN}+cu130"])
@pytest.mark.parametrize("choice", ["auto", "cpu"])
def test_a_torch_at_the_pin_is_left_alone(pip, monkeypatch, capsys, have, choice):
    _linux_without_gpu(monkeypatch)
    pip.before = have
    assert install_torch.ensure_torch(choice, ROOT / "requirements.txt") == have
    assert pip.calls == [] and "nothing to do" in capsys.readouterr().out


@pytest.mark.parametrize("before", [None, "2.12.0+cpu"])
def test_linux_without_a_gpu_gets_the_cpu_build_from_the_cpu_index(pip, monkeypatch, before):
    _linux_without_gpu(monkeypatch)
    pip.before = before
    assert install_torch.ensure_torch("auto", ROOT / "requirements.txt") == f"{PIN}+cpu"
    [call] = pip.calls
    assert call[0] == f"torch=={PIN}" and call[call.index("--index-url") + 1] == install_torch.CPU_INDEX


def test_an_unreachable_cpu_index_falls_back_to_pips_own_index(pip, monkeypatch, capsys):
    _linux_without_gpu(monkeypatch)
    pip.results = [1, 0]
    install_torch.ensure_torch("auto", ROOT / "requirements.txt")
    assert pip.calls[1] == (f"torch=={PIN}",)
    assert "falling back to `pip install torch==" in capsys.readouterr().out


def test_a_cpu_index_that_cannot_be_reached_is_not_tried(pip, monkeypatch, capsys):
    """Where the index's host cannot be looked up, pip would retry it for every dependency: the
    fallback is taken at once."""
    _linux_without_gpu(monkeypatch)
    pip.reachable = False
    install_torch.ensure_torch("auto", ROOT / "requirements.txt")
    assert pip.calls == [(f"torch=={PIN}",)]
    assert "cannot be reached" in capsys.readouterr().out


def test_index_reachable_answers_false_for_an_address_that_does_not_resolve():
    assert install_torch.index_reachable("http://kvlib-no-such-host.invalid", timeout=5) is False


def test_when_both_fail_the_error_says_what_to_do(pip, monkeypatch):
    _linux_without_gpu(monkeypatch)
    pip.results = [1, 1]
    with pytest.raises(install_torch.SetupError, match=rf"could not install torch=={re.escape(PIN)}.*--index-url"):
        install_torch.ensure_torch("auto", ROOT / "requirements.txt")


def test_every_pip_call_names_the_exact_pin(pip, monkeypatch):
    _linux_without_gpu(monkeypatch)
    pip.results = [1, 0]
    install_torch.ensure_torch("cpu", ROOT / "requirements.txt")
    requirements = [a for call in pip.calls for a in call if a.startswith("torch")]
    assert requirements == [f"torch=={PIN}"] * 2


def test_another_version_after_pip_is_an_error(pip, monkeypatch):
    _linux_without_gpu(monkeypatch)
    pip.after = "2.14.0+cpu"
    with pytest.raises(install_torch.SetupError, match="the environment has torch 2.14.0"):
        install_torch.ensure_torch("auto", ROOT / "requirements.txt")


def test_cuda_replaces_a_cpu_build_and_warns_if_pip_takes_one_again(pip, monkeypatch, capsys):
    _linux_without_gpu(monkeypatch)
    pip.before = f"{PIN}+cpu"
    install_torch.ensure_torch("cuda", ROOT / "requirements.txt")
    assert pip.uninstalled and pip.calls == [(f"torch=={PIN}",)]
    assert "a CPU build" in capsys.readouterr().err
    pip.calls, pip.before, pip.after, pip.uninstalled = [], PIN, PIN, False
    install_torch.ensure_torch("cuda", ROOT / "requirements.txt")      # PyPI's build already: nothing
    assert pip.calls == [] and not pip.uninstalled


def test_make_setup_installs_torch_first_and_a_new_choice_runs_it_again():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH \?= auto$", makefile, re.MULTILINE)
    assert "TORCH_STAMP := $(VENV)/.kvlib-torch-$(TORCH)" in makefile
    assert re.search(r"^\$\(STAMP\): requirements\.txt requirements\.lock pyproject\.toml \| \$\(TORCH_STAMP\)$", makefile,
                     re.MULTILINE)
    assert "scripts/install_torch.py --torch $(TORCH)" in makefile


def test_the_cli_reports_a_bad_choice(capsys):
    assert install_torch.main(["--torch", "gpu"]) == 1
    assert "TORCH must be one of" in capsys.readouterr().err
