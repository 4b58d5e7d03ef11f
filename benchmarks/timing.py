"""Timing, peak memory and a bandwidth probe for the benchmarks.

Conventions (as in ``../shared/docs/baselines.md``):

* time: CUDA events around each call, median of ``iters`` timed calls after ``warmup``
  untimed ones (defaults 5 and 20); on the CPU, ``time.perf_counter``.
* ``fwd``: one forward call with autograd recording (training mode), output discarded.
* ``fwd+bwd``: forward, then ``backward()`` of a fixed random output gradient (drawn once,
  seeded); every ``.grad`` the call fills is set to ``None`` before the next call, outside
  the timed region.
* ``peak``: bytes allocated during one forward on top of what was allocated just before it
  (``max_memory_allocated() - memory_allocated()`` after ``reset_peak_memory_stats()``);
  includes the output and everything autograd saved for backward.
* A ``torch.cuda.OutOfMemoryError`` anywhere makes that measurement ``"OOM"`` (and the
  ones after it in the same :func:`measure` call); memory is freed before returning.

Inputs are the same tensors on every call: graphs whose features fit in the 60 MB L2 are
measured warm in L2, as the stock baselines were.
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

OOM = "OOM"
Number = Union[float, str, None]


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _first(out):
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def time_calls(fn: Callable[[], object], warmup: int, iters: int, device: torch.device,
               before: Optional[Callable[[], None]] = None) -> List[float]:
    """Milliseconds of each of ``iters`` calls of ``fn`` after ``warmup`` calls.

    ``before`` runs ahead of every call, outside the timed region (e.g. clearing grads).
    """
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            if before is not None:
                before()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]
    out = []
    for _ in range(iters):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def peak_forward_mb(forward: Callable[[], object], device: torch.device) -> Optional[float]:
    """MB allocated by one forward on top of what was allocated before it (None on CPU)."""
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = forward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return peak / 2**20


def measure(forward: Callable[[], object], grad_targets: Sequence[torch.Tensor] = (),
            warmup: int = 5, iters: int = 20, device=None, backward: bool = True,
            seed: int = 1234) -> Dict[str, Number]:
    """Time ``forward`` (fwd), forward+backward (fwd_bwd) and the forward peak memory.

    Args:
        forward: a no-argument callable returning the output tensor (or a tuple, whose first
            element is used).
        grad_targets: tensors whose ``.grad`` is cleared (set to None) before each call:
            the differentiable inputs and the module parameters.
        backward: also time forward+backward.

    Returns a dict with ``fwd_ms``, ``fwd_bwd_ms``, ``peak_mb`` (floats, ``"OOM"`` or
    None when not measured) and ``fwd_ms_all`` / ``fwd_bwd_ms_all`` (every timed call).
    """
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res: Dict[str, Number] = {"fwd_ms": None, "fwd_bwd_ms": None, "peak_mb": None, "warmup": warmup, "iters": iters}
    targets = list(grad_targets)

    def clear():
        for t in targets:
            t.grad = None

    stage = "fwd_ms"
    failure = None
    try:
        clear()
        with torch.enable_grad():
            times = time_calls(lambda: _first(forward()), warmup, iters, device)
        res["fwd_ms"] = statistics.median(times)
        res["fwd_ms_all"] = [round(t, 4) for t in times]
        stage = "peak_mb"
        with torch.enable_grad():
            res["peak_mb"] = peak_forward_mb(lambda: _first(forward()), device)
        if backward:
            stage = "fwd_bwd_ms"
            with torch.enable_grad():
                out = _first(forward())
                if not out.requires_grad:
                    raise RuntimeError("output does not require grad: nothing to backpropagate")
                gen = torch.Generator(device=out.device).manual_seed(seed)
                grad_out = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)
                del out

                def step():
                    _first(forward()).backward(grad_out)

                times = time_calls(step, warmup, iters, device, before=clear)
            res["fwd_bwd_ms"] = statistics.median(times)
            res["fwd_bwd_ms_all"] = [round(t, 4) for t in times]
            clear()
    except Exception as exc:  # noqa: BLE001 - OOM is a result; anything else is reported too
        failure = (is_oom(exc), f"{type(exc).__name__}: {exc}"[:500])
    if failure is not None:
        # outside the except block: the traceback (and the tensors its frames hold) is gone
        oom, message = failure
        keys = ["fwd_ms", "peak_mb", "fwd_bwd_ms"]
        for k in keys[keys.index(stage):]:
            if k == "fwd_bwd_ms" and not backward:
                continue
            res[k] = OOM if oom else "error"
        if not oom:
            res["error"] = message
        clear()
        free_memory()
    return res


def measure_bandwidth(nbytes: int = 2 * 2**30, warmup: int = 3, iters: int = 20, device="cuda") -> Optional[dict]:
    """Device-to-device copy bandwidth: (bytes read + bytes written) / median time.

    Returns ``{"gb_s": ..., "bytes": ..., "ms": ...}`` (GB = 1e9 bytes), or None without a GPU.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    n = nbytes // 4
    try:
        times = _copy_times(n, warmup, iters, device)
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        times = None
    free_memory()
    if times is None:
        return measure_bandwidth(nbytes // 4, warmup, iters, device) if nbytes > 2**26 else None
    ms = statistics.median(times)
    moved = 2 * n * 4
    return {"gb_s": moved / (ms * 1e-3) / 1e9, "bytes": moved, "ms": ms}


def _copy_times(n: int, warmup: int, iters: int, device: torch.device) -> List[float]:
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return time_calls(lambda: dst.copy_(src), warmup, iters, device)


def fmt(value: Number, digits: int = 2) -> str:
    """Table cell: numbers rounded, strings (OOM, error, n/a) as they are, None as ''."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.1f}"
    return f"{value:.{digits}f}" if value >= 0.1 else f"{value:.3f}"


# ----------------------------------------------------------------------------- dtypes
#: The dtypes the benchmarks take by name (``--dtypes float32,bfloat16``), with short labels.
DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}


def parse_dtypes(text: str, option: str = "--dtypes") -> List[str]:
    """Canonical dtype names from a comma list (``fp32``/``bf16``/``fp16`` accepted too)."""
    names: List[str] = []
    for item in (t.strip().lower() for t in text.split(",")):
        if not item:
            continue
        name = _ALIASES.get(item, item)
        if name not in DTYPES:
            raise SystemExit(f"{option}: unknown dtype {item!r}; known: {', '.join(DTYPES)}")
        if name not in names:
            names.append(name)
    if not names:
        raise SystemExit(f"{option}: no dtype given")
    return names


def autocast(device: torch.device, dtype_name: Optional[str]):
    """``torch.autocast(device.type, dtype)`` for a 16-bit dtype name; a no-op context for
    float32 / None (so one code path serves both)."""
    import contextlib

    if dtype_name in (None, "float32", "off"):
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[dtype_name])


def import_pyg():
    """``torch_geometric`` with its ``nn`` package loaded, or None after printing why it does
    not import (the layer benchmarks then have nothing to measure and exit 0)."""
    try:
        import torch_geometric as pyg
        import torch_geometric.nn  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"torch_geometric is not importable ({exc}); nothing to benchmark")
        return None
    scatter_without_cpu_only_torch_scatter(pyg)
    return pyg


def scatter_without_cpu_only_torch_scatter(pyg) -> None:
    """PyG routes scatter (e.g. SAGEConv's max) to torch_scatter whenever it imports; a
    CPU-only build (what the device runs get, built from source for NeighborLoader's sampling)
    then fails on CUDA tensors ("Not compiled with CUDA support"). Stock is measured (and, in
    the tests, compared) as it runs without torch_scatter: torch's own scatter_reduce."""
    if not (getattr(pyg.typing, "WITH_TORCH_SCATTER", False) and torch.cuda.is_available()):
        return
    try:
        cuda_version = torch.ops.torch_scatter.cuda_version()
    except Exception:  # noqa: BLE001 - an old build without the op: leave PyG's choice alone
        return
    if cuda_version == -1:
        pyg.typing.WITH_TORCH_SCATTER = False
        print("torch_scatter is a CPU-only build: PyG's scatter uses torch's scatter_reduce in this run")


# ----------------------------------------------------------------------------- watchdog
def watchdog(seconds: Optional[float]):
    """Context manager: when the block runs longer than ``seconds``, print every thread's
    Python traceback to stderr and exit the process (``faulthandler``, exit code 1), so a
    hang (e.g. a deadlock) leaves a stack in the log instead of a silent timeout; the results
    written so far stay. ``None`` / 0: no watchdog."""
    import contextlib
    import faulthandler
    import sys

    @contextlib.contextmanager
    def guard():
        if not seconds or seconds <= 0:
            yield
            return
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()

    return guard()


#: The warning torch gives at every synchronising operation under set_sync_debug_mode("warn")
#: (the mode's own "prototype feature" warning, given when it is switched on, is not one).
SYNC_WARNING = "called a synchronizing CUDA operation"


def count_syncs(fn: Callable[[], object], device: Optional[torch.device] = None) -> Optional[int]:
    """Host synchronisations torch reports while ``fn()`` runs (``set_sync_debug_mode("warn")``;
    the package's kernel launches never synchronise); None on a non-CUDA ``device``."""
    if device is not None and device.type != "cuda":
        return None
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum(SYNC_WARNING in str(w.message) for w in caught)
