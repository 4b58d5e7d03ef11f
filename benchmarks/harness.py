"""The benchmarks' shared harness: timing, memory, the environment a result was measured in,
and writing results (JSON and markdown). Every benchmark tool imports it; it imports no tool.

Timing conventions (as in ``../shared/docs/baselines.md``):

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

Results: :func:`environment` (GPU model, versions, commit, time, measured bandwidth) goes into
every JSON file; :func:`write_json` writes atomically; :func:`markdown_table` and
:func:`env_header` make the markdown. The benchmark graphs are :mod:`benchmarks.graphs`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results"

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

    if dtype_name in (None, "float32", "off"):
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=DTYPES[dtype_name])


# ----------------------------------------------------------------------------- frameworks
_FRAMEWORKS = None


def frameworks():
    """``tests/frameworks.py``, loaded by path: the one place that knows how to import DGL past
    its GraphBolt failure on newer torch, stock PyG's CPU-only torch_scatter workaround and the
    host-synchronisation counter. Tests and benchmarks share it; no test imports a benchmark."""
    global _FRAMEWORKS
    if _FRAMEWORKS is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_gfp_frameworks", REPO_ROOT / "tests" / "frameworks.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _FRAMEWORKS = mod
    return _FRAMEWORKS


def import_pyg():
    """``torch_geometric`` with its ``nn`` package loaded, or None after printing why it does
    not import (the layer benchmarks then have nothing to measure and exit 0). A CPU-only
    torch_scatter is kept away from CUDA tensors (stock then runs torch's scatter_reduce)."""
    try:
        import torch_geometric as pyg
        import torch_geometric.nn  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"torch_geometric is not importable ({exc}); nothing to benchmark")
        return None
    frameworks().scatter_without_cpu_only_torch_scatter(pyg)
    return pyg


def import_dgl():
    """DGL (through ``tests/frameworks.py``), or None."""
    try:
        return frameworks().import_dgl()
    except Exception:  # noqa: BLE001
        return None


def count_syncs(fn: Callable[[], object], device: Optional[torch.device] = None) -> Optional[int]:
    """Host synchronisations torch reports while ``fn()`` runs (``tests/frameworks.py``'s
    counter); None on a non-CUDA ``device``."""
    return frameworks().count_syncs(fn, device)


def fastpath():
    """``(gnn_fastpath, None)``, or ``(None, why)`` when it does not import (stock rows only)."""
    try:
        import gnn_fastpath
    except Exception as exc:  # noqa: BLE001
        return None, f"gnn_fastpath does not import: {type(exc).__name__}: {exc}"
    return gnn_fastpath, None


# ----------------------------------------------------------------------------- watchdog
#: How long after a watchdog's timeout faulthandler's own watchdog reports (see :func:`watchdog`).
GIL_GRACE_S = 30.0


def watchdog(seconds: Optional[float]):
    """Context manager: when the block runs longer than ``seconds``, print every thread's
    Python traceback to stderr and exit the process (exit code 1), so a hang (e.g. a deadlock)
    leaves a stack in the log instead of a silent timeout; the results written so far stay.
    ``None`` / 0: no watchdog.

    The stacks are dumped from a Python thread, holding the GIL, so every frame is read in a
    consistent state: ``faulthandler``'s own watchdog reads them without it and can crash the
    process (SIGSEGV) halfway through the dump. A hang that never releases the GIL stops that
    thread too; ``faulthandler``'s watchdog, :data:`GIL_GRACE_S` later, still reports it."""
    import contextlib
    import datetime
    import faulthandler
    import os
    import sys
    import threading

    def expire():
        sys.stderr.write(f"Timeout ({datetime.timedelta(seconds=seconds)})!\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    @contextlib.contextmanager
    def guard():
        if not seconds or seconds <= 0:
            yield
            return
        timer = threading.Timer(seconds, expire)
        timer.daemon = True
        timer.start()
        faulthandler.dump_traceback_later(seconds + GIL_GRACE_S, exit=True, file=sys.stderr)
        try:
            yield
        finally:
            timer.cancel()
            faulthandler.cancel_dump_traceback_later()

    return guard()


# ----------------------------------------------------------------------------- command lines
@contextlib.contextmanager
def settings_env(**values: str):
    """Environment variables (gnn_fastpath's settings) set to ``values`` inside, restored after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pick_device(text: str) -> torch.device:
    """``--device``: ``auto`` (cuda when available), ``cuda`` or ``cpu``."""
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(text)


def names(text: Optional[str], known: Sequence[str], option: str) -> List[str]:
    """A comma list of names, each one of ``known`` (SystemExit naming the unknown ones)."""
    out = [t.strip() for t in (text or "").split(",") if t.strip()]
    bad = [t for t in out if t not in known]
    if bad:
        raise SystemExit(f"{option}: unknown {bad}; known: {', '.join(known)}")
    return out


def int_list(text: str, option: str) -> List[int]:
    """A comma list of positive integers."""
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"{option}: expected a comma list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise SystemExit(f"{option}: expected positive integers, got {text!r}")
    return values


# ----------------------------------------------------------------------------- environment
def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - broken metadata must not stop a benchmark
        return None


def git_commit() -> Optional[str]:
    """``GNN_FASTPATH_COMMIT`` when set (the device copy has no .git), else ``git rev-parse HEAD``."""
    env = os.environ.get("GNN_FASTPATH_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            sha = out.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                   capture_output=True, text=True, timeout=10)
            return sha + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def cupy_info() -> Dict[str, Optional[str]]:
    info: Dict[str, Optional[str]] = {"cupy": _version("cupy-cuda13x") or _version("cupy-cuda12x") or _version("cupy")}
    try:
        import cupy

        info["cupy"] = cupy.__version__
        if torch.cuda.is_available():
            info["cupy_cuda_runtime"] = str(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:  # noqa: BLE001
        pass
    return info


def environment(bandwidth: Optional[dict] = None) -> dict:
    """What the numbers were measured on: GPU, versions, commit, time, measured bandwidth."""
    env = {
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_geometric": _version("torch_geometric") or _version("torch-geometric"),
        "dgl": _version("dgl"),
        "numpy": _version("numpy"),
        "gnn_fastpath": None,
        "gpu": None,
        "gpu_count": 0,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
    env.update(cupy_info())
    try:
        import gnn_fastpath

        env["gnn_fastpath"] = getattr(gnn_fastpath, "__version__", None)
        env["gnn_fastpath_cuda"] = gnn_fastpath.cuda.unavailable_reason() or "available"
    except Exception as exc:  # noqa: BLE001
        env["gnn_fastpath"] = f"import failed: {type(exc).__name__}: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   sm_count=props.multi_processor_count,
                   l2_mb=round(getattr(props, "L2_cache_size", 0) / 1e6, 1),
                   capability=f"{props.major}.{props.minor}")
    env["gnn_fastpath_env"] = {k: v for k, v in os.environ.items() if k.startswith("GNN_FASTPATH_")}
    if bandwidth:
        env["bandwidth_gb_s"] = round(bandwidth["gb_s"], 1)
        env["bandwidth_probe"] = bandwidth
    return env


def env_header(env: dict) -> str:
    """One markdown paragraph naming the machine and versions."""
    bw = env.get("bandwidth_gb_s")
    parts = [
        f"GPU: {env.get('gpu') or 'none'}",
        f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')})",
        f"CuPy {env.get('cupy')}",
        f"PyG {env.get('torch_geometric')}",
        f"commit {env.get('git_commit')}",
        f"{env.get('timestamp_utc')}",
    ]
    if bw:
        parts.append(f"measured copy bandwidth {bw:,.0f} GB/s")
    if env.get("gnn_fastpath_env"):
        parts.append("env " + " ".join(f"{k}={v}" for k, v in sorted(env["gnn_fastpath_env"].items())))
    return "; ".join(parts)


# ----------------------------------------------------------------------------- results
def out_dir(path=None) -> Path:
    """The results directory (created by the first write into it)."""
    return Path(path) if path is not None else DEFAULT_OUT


def write_json(path, payload: dict) -> Path:
    """Write atomically (a partial file never replaces a complete one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)
    return path


def write_text(path, text: str) -> None:
    """Write ``text`` where ``path`` says (None or empty: nowhere), parents created."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)


def publish(payload: dict, text: str, json_path=None, md_path=None) -> None:
    """Print a benchmark's markdown ``text`` and write its JSON ``payload`` and the text where
    asked (paths None or empty: not written)."""
    print(text)
    if json_path:
        write_json(json_path, payload)
    write_text(md_path, text)


def markdown_table(rows: Sequence[dict], columns: Sequence[str], headers: Optional[Sequence[str]] = None,
                   formatters: Optional[Dict[str, callable]] = None) -> str:
    """A GitHub markdown table of ``rows`` (dicts) over ``columns``."""
    headers = list(headers or columns)
    formatters = formatters or {}
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            f = formatters.get(c)
            cells.append(f(v) if f is not None else ("" if v is None else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
