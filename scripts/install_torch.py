"""`make setup`'s first step: PyTorch at the version requirements.txt pins, in the build asked for.

    python scripts/install_torch.py [--torch auto|cpu|cuda] [--requirements requirements.txt]

The Makefile runs it with the virtual environment's Python (standard library only) before
``pip install -r requirements.txt``, whose pin then finds torch installed and keeps it
(``2.13.0+cpu`` satisfies ``torch==2.13.0``). ``--torch`` (``make setup TORCH=...``):

- ``auto`` (the default): the CPU build on Linux without an NVIDIA GPU (no ``nvidia-smi`` on
  PATH); elsewhere PyPI's build (on Linux, the CUDA one; on macOS and Windows, the only one);
- ``cpu``: the CPU build, from PyTorch's CPU index;
- ``cuda``: PyPI's build, replacing a CPU build already installed.

For ``auto`` and ``cpu``, an environment that already has torch at the pinned version (whatever
its build) is left alone. When PyTorch's CPU index cannot be reached, it falls back to a plain
``pip install torch==<pin>`` (pip's own configuration: PyPI, a mirror, or wheels on disk) and says
so. pip is always given the exact pin, so it never resolves another version; the version
installed at the end is checked.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import platform
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CHOICES = ("auto", "cpu", "cuda")
# A short wait for the CPU index: where it cannot be reached, the fallback is the way.
CPU_INDEX_PIP_OPTIONS = ["--timeout", "20", "--retries", "1"]


class SetupError(RuntimeError):
    """The pin is missing or pip could not install it (the message says what to do)."""


def pinned_version(requirements: Path) -> str:
    """The version of ``torch==X`` in ``requirements``; SetupError if there is none."""
    match = re.search(r"^torch==([^\s;#]+)", requirements.read_text(encoding="utf-8"), re.MULTILINE)
    if not match:
        raise SetupError(f"{requirements} pins no torch version (a line 'torch==X.Y.Z'): add one, so that "
                         "pip installs the version the chapter is tested with")
    return match.group(1)


def installed_version() -> str | None:
    """The version of torch in this Python's environment (``2.13.0+cpu``), or None."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def build_for(choice: str, system: str | None = None, nvidia: bool | None = None) -> str:
    """``"cpu"`` or ``"pypi"``: which build ``choice`` means on this system (``system`` as
    platform.system() names it; ``nvidia``: whether ``nvidia-smi`` is on PATH)."""
    if choice not in CHOICES:
        raise SetupError(f"TORCH must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice != "auto":
        return "cpu" if choice == "cpu" else "pypi"
    system = platform.system() if system is None else system
    nvidia = shutil.which("nvidia-smi") is not None if nvidia is None else nvidia
    return "cpu" if system == "Linux" and not nvidia else "pypi"


def index_reachable(url: str = CPU_INDEX, timeout: float = 10.0) -> bool:
    """Whether ``url`` answers at all (one request, ``timeout`` seconds): where it cannot even be
    looked up, pip would spend minutes retrying it for torch and each of its dependencies."""
    try:
        with urllib.request.urlopen(f"{url}/torch/", timeout=timeout):
            return True
    except OSError:
        return False


def pip_install(*args: str) -> int:
    """``python -m pip install --quiet ARGS`` in this environment; its exit status."""
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args]).returncode


def install(pin: str, build: str, have: str | None) -> None:
    """Install ``torch==pin`` in ``build`` (``"cpu"`` or ``"pypi"``); ``have``: the version installed."""
    requirement = f"torch=={pin}"
    if build == "pypi" and have and have.endswith("+cpu"):
        print(f"install_torch: replacing torch {have} (the CPU build) with PyPI's build", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", "torch"], check=False)
    if build == "cpu":
        print(f"install_torch: {requirement}, the CPU build, from {CPU_INDEX} "
              "(make setup TORCH=cuda for the CUDA build)", flush=True)
        if not index_reachable():
            print(f"install_torch: {CPU_INDEX} cannot be reached from here", flush=True)
        elif pip_install(requirement, "--index-url", CPU_INDEX, *CPU_INDEX_PIP_OPTIONS) == 0:
            return
        print(f"install_torch: {CPU_INDEX} could not be used (above); falling back to `pip install "
              f"{requirement}` from pip's own index or mirror (on Linux that is usually the CUDA build, "
              "several GB)", flush=True)
    else:
        print(f"install_torch: {requirement} from pip's own index (PyPI's build)", flush=True)
    if pip_install(requirement) != 0:
        raise SetupError(f"pip could not install {requirement} (its message is above). Check access to "
                         f"PyPI or your mirror, or install it yourself into this environment, then run make "
                         f"setup again: {sys.executable} -m pip install {requirement} --index-url {CPU_INDEX}")


def ensure_torch(choice: str, requirements: Path) -> str:
    """Make this environment hold torch at the pin of ``requirements``, in the build ``choice``
    asks for; return the version installed. SetupError if that fails."""
    pin, have = pinned_version(requirements), installed_version()
    build = build_for(choice)
    same_version = have is not None and have.split("+")[0] == pin
    if same_version and (choice != "cuda" or not have.endswith("+cpu")):     # cuda replaces a CPU build
        print(f"install_torch: torch {have} is already installed (the pin is {pin}): nothing to do", flush=True)
        return have
    install(pin, build, have)
    got = installed_version()
    if got is None or got.split("+")[0] != pin:
        raise SetupError(f"after installing torch=={pin}, the environment has torch {got}: remove it "
                         f"({sys.executable} -m pip uninstall torch) and run make setup again")
    if choice == "cuda" and got.endswith("+cpu"):
        print(f"install_torch: warning: pip installed torch {got}, a CPU build: pip's configuration "
              "offers that wheel first (pip config list: find-links or an index)", file=sys.stderr)
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", default="auto", help="auto (default), cpu or cuda: which build of PyTorch")
    parser.add_argument("--requirements", type=Path, default=Path("requirements.txt"),
                        help="the file that pins torch==X (default: requirements.txt)")
    args = parser.parse_args(argv)
    try:
        ensure_torch(args.torch, args.requirements)
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
