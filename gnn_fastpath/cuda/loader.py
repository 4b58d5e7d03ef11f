"""Compile the package's .cu sources with CuPy (NVRTC) and launch them on torch's stream.

Sources live beside this file. A module is compiled on first use per device and cached;
kernels receive raw device pointers of torch tensors, so no copies are made, and every
launch goes on torch's current CUDA stream (``cupy.cuda.ExternalStream``), so ops order
correctly with the surrounding torch work without host synchronisation.
"""
from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

SOURCE_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_reason: Optional[str] = None
_checked = False


def _probe() -> Optional[str]:
    """None when CuPy and a CUDA GPU are usable, else a human-readable reason."""
    if os.environ.get("GNN_FASTPATH_DISABLE_CUDA", "") not in ("", "0"):
        return "disabled by GNN_FASTPATH_DISABLE_CUDA"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        return (f"CuPy is not importable ({type(exc).__name__}: {exc}); "
                "install gnn-fastpath[cuda12] or gnn-fastpath[cuda13]")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:
        return f"CuPy cannot reach the GPU ({type(exc).__name__}: {exc})"
    return None


def available() -> bool:
    """True when the CUDA kernels can run here (CuPy importable, a GPU visible)."""
    global _checked, _reason
    if not _checked:
        with _lock:
            if not _checked:
                _reason = _probe()
                _checked = True
    return _reason is None


def unavailable_reason() -> Optional[str]:
    """Why the kernels cannot run here, or None when they can."""
    available()
    return _reason


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


_COMPILE_OPTIONS = ("-std=c++17",)


@functools.lru_cache(maxsize=None)
def _module(name: str, name_expressions: Tuple[str, ...], device_index: int):
    import cupy

    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=read_source(name), options=_COMPILE_OPTIONS,
                                name_expressions=name_expressions or None)
        module.compile()
    return module


def get_kernel(source: str, kernel: str, device: torch.device, name_expressions: Sequence[str] = ()):
    """The CuPy kernel ``kernel`` from ``source`` compiled for ``device`` (cached).

    Templated kernels are named by their instantiation (e.g. ``"fill<64>"``) and must be
    listed in ``name_expressions``; the whole list is compiled together once.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    module = _module(source, tuple(name_expressions), index)
    return module.get_function(kernel)


@functools.lru_cache(maxsize=64)
def _external_stream(ptr: int, device_index: int):
    import warnings

    import cupy

    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream; made once per stream
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return cupy.cuda.ExternalStream(ptr, device_index)


def ptr(t: Optional[torch.Tensor]) -> np.uint64:
    """A tensor's device address as a kernel argument (0 for None)."""
    return np.uint64(0 if t is None else t.data_ptr())


def launch(kernel, grid, block, args, device: torch.device, shared_mem: int = 0) -> None:
    """Launch ``kernel`` on torch's current stream of ``device``.

    Goes straight to the compiled function with an explicit stream (no CuPy stream or
    device context managers per launch: they cost tens of microseconds of host time per
    op). CuPy raises on a failed launch (bad configuration, too many resources), so every
    launch is checked; faults inside a kernel surface at the next synchronising call.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _external_stream(torch.cuda.current_stream(index).cuda_stream, index)
    if torch.cuda.current_device() == index:
        kernel.kernel(tuple(grid), tuple(block), tuple(args), shared_mem, stream)
    else:
        import cupy

        with cupy.cuda.Device(index):
            kernel.kernel(tuple(grid), tuple(block), tuple(args), shared_mem, stream)
