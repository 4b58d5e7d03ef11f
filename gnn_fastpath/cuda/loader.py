"""Whether the CUDA kernels can run here, and the .cu sources as NVRTC sees them.

Nothing here imports CuPy until it is needed, so the package imports without it. Compiling
and launching live in :mod:`gnn_fastpath.cuda.launch`.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional

import torch

from .. import config

SOURCE_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_reason: Optional[str] = None
_checked = False
_DISABLED = "disabled by GNN_FASTPATH_DISABLE_CUDA"


def _probe() -> Optional[str]:
    """None when CuPy and a CUDA GPU are usable, else a human-readable reason."""
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:  # not installed, or built for another CUDA
        return (f"CuPy is not importable ({type(exc).__name__}: {exc}); "
                "install gnn-fastpath[cuda12] or gnn-fastpath[cuda13]")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return f"CuPy cannot reach the GPU ({type(exc).__name__}: {exc})"
    return None


def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here, or None when they can.

    ``GNN_FASTPATH_DISABLE_CUDA`` is read on every call (the config rule); the probe of
    CuPy and the GPU runs once per process.
    """
    global _checked, _reason
    if config.setting("GNN_FASTPATH_DISABLE_CUDA"):
        return _DISABLED
    if not _checked:
        with _lock:
            if not _checked:
                _reason = _probe()
                _checked = True
    return _reason


def available() -> bool:
    """True when the CUDA kernels can run here (CuPy importable, a GPU visible)."""
    return unavailable_reason() is None


def read_source(name: str, _seen: Optional[set] = None) -> str:
    """The text of ``name`` (a .cu file beside this module), with its .cuh includes inlined.

    NVRTC gets one self-contained string, so the build does not depend on include paths.
    Each header is inlined once per source, wherever it is included first.
    """
    seen = set() if _seen is None else _seen
    text = (SOURCE_DIR / name).read_text()
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith('#include "') and stripped.endswith('.cuh"'):
            header = stripped[len('#include "'):-1]
            if header not in seen:
                seen.add(header)
                out.append(read_source(header, seen))
        else:
            out.append(line)
    return "\n".join(out)
