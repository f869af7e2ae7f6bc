"""binder/ (the Binder button's environment) pins what requirements.txt pins, takes PyTorch's
CPU build, and installs kvlib and the model file."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_binder_pins_what_make_pins():
    binder, make = _pins(ROOT / "binder" / "requirements.txt"), _pins(ROOT / "requirements.txt")
    assert {"torch", "numpy", "gguf", "tokenizers", "ipywidgets", "matplotlib", "ipykernel"} <= set(binder)
    differ = {name: (v, make.get(name)) for name, v in binder.items() if make.get(name) != v}
    assert not differ, f"binder/requirements.txt and requirements.txt pin different versions: {differ}"


# What repo2docker's base environment for Python 3.11 installs before binder/requirements.txt
# (https://github.com/jupyterhub/repo2docker/blob/main/repo2docker/buildpacks/conda/environment.py-3.11.yml,
# generated 2025-10-16): the Jupyter server and its front ends, each at a major version, set together.
REPO2DOCKER_BASE = {"ipywidgets": "8", "jupyter-offlinenotebook": "0.3", "jupyter-resource-usage": "1",
                    "jupyter-server": "2", "jupyterhub-singleuser": "5", "jupyterlab": "4", "notebook": "7"}


def test_binder_leaves_the_base_environments_jupyter_alone():
    """No pin of the base's server or front ends (one of them pinned apart from the others broke
    the set: notebook 7.4 takes only its own JupyterLab minor); ipywidgets, which the stored
    widgets need at 8.1, within the base's major."""
    binder = {re.sub(r"[-_.]+", "-", k): v for k, v in _pins(ROOT / "binder" / "requirements.txt").items()}
    pinned = set(binder) & set(REPO2DOCKER_BASE)
    assert pinned == {"ipywidgets"}, f"binder/requirements.txt pins the base's {sorted(pinned - {'ipywidgets'})}"
    assert binder["ipywidgets"].split(".")[0] == REPO2DOCKER_BASE["ipywidgets"]


def test_the_launch_buttons_open_jupyterlab():
    import yaml
    assert yaml.safe_load((ROOT / "_config.yml").read_text())["launch_buttons"]["notebook_interface"] == "jupyterlab"


def test_binder_takes_the_cpu_build_of_torch():
    text = (ROOT / "binder" / "requirements.txt").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in text


def test_binder_installs_kvlib_and_fetches_the_model():
    post = ROOT / "binder" / "postBuild"
    assert post.stat().st_mode & 0o111, "binder/postBuild must be executable"
    text = post.read_text()
    assert "pip install --no-deps ." in text and "python -m kvlib.smollm2.weights" in text


def test_binder_runs_the_tested_python():
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"


def test_binder_starts_kernels_with_the_malloc_setting_make_test_binder_measures_with():
    """binder/start hands large freed blocks back to the system (glibc's mmap threshold), and
    `make test-binder` holds the notebooks to 2 GiB with the same value, read from that file."""
    start = ROOT / "binder" / "start"
    assert start.stat().st_mode & 0o111, "binder/start must be executable"
    lines = start.read_text().splitlines()
    assert "export MALLOC_MMAP_THRESHOLD_=4194304" in lines and lines[-1] == 'exec "$@"'
    make = (ROOT / "Makefile").read_text()
    assert "MALLOC_MMAP_THRESHOLD_=$(BINDER_MMAP_THRESHOLD)" in make and "binder/start" in make
