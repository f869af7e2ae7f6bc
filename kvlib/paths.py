"""kvlib's per-user folder: the model file, torch.compile's compiled code and the kernel choices
measured on this machine are kept there, so that a second run reuses them."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_CACHE", "cache_dir"]

ENV_CACHE = "KVLIB_CACHE_DIR"


def cache_dir() -> Path:
    """``$KVLIB_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvlib``, else ``~/.cache/kvlib`` (not created here)."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "kvlib"
    return Path.home() / ".cache" / "kvlib"
