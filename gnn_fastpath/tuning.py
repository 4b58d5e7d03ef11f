"""Measured choices between kernel variants, made once per size class and kept across processes.

Several kernel families have variants whose order of speed depends on the graph and the
width (a backward with atomics or a source-major pass, feature chunks per lane, ...). A
fixed rule (mean out-degree) picks wrongly on some graphs, so with ``GNN_FASTPATH_TUNE=1``
(the default) the first call of a *size class* times every variant on the call's own inputs
and keeps the fastest:

- a size class (:func:`size_class`) is the op's decision, the node and edge counts, the
  mean degrees and the degree skew rounded to powers of two, the row width and the dtype:
  graphs of one class share the choice, and a training run's mini-batches fall into a few
  classes;
- choices are written to a small JSON file (``GNN_FASTPATH_TUNE_CACHE``, default
  ``~/.cache/gnn_fastpath/tuning.json``) under a key naming the GPU model, the gnn_fastpath
  and torch versions (:func:`device_key`), so the next process does not time again, and a
  choice timed on another GPU or another version is never used;
- :func:`listing` shows every choice (the debug listing), with its timings.

Timing synchronises with the host and runs each variant 16 times (:data:`ROUNDS` x
:data:`CALLS` and a warm-up), once per class and process at most; it never runs while a CUDA
graph is being captured or on a static graph (the compiled path), which read the remembered
choice or the rule. A variant that runs out of GPU memory while being timed ends the timing:
the call takes the rule, and nothing is remembered. ``GNN_FASTPATH_TUNE=0`` keeps the rules.
"""
from __future__ import annotations

import functools
import json
import math
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional

import torch

from . import config

#: Version of the file layout; a file of another version is ignored (and replaced on write).
FORMAT = 1
#: Timing rounds: each round times every variant once, in turn (so drift hits them alike);
#: a variant's median over the rounds counts. Every variant runs once untimed first
#: (compiles and warms it).
ROUNDS = 5
#: Calls per timed sample, back to back: a call that is short on the GPU is then timed by
#: its kernels, not by the gaps while the host launches them.
CALLS = 3

_lock = threading.Lock()
#: path -> the file's entries as last read or written by this process
_loaded: Dict[str, dict] = {}


def enabled() -> bool:
    """Whether ``GNN_FASTPATH_TUNE`` asks for measured choices."""
    return bool(config.setting("GNN_FASTPATH_TUNE"))


def cache_path() -> Path:
    """The choices file: ``GNN_FASTPATH_TUNE_CACHE``, or ``~/.cache/gnn_fastpath/tuning.json``
    (asked on every tuned call: the path is built once per setting value, the home folder
    taken when first needed)."""
    return _cache_path(config.setting("GNN_FASTPATH_TUNE_CACHE"))


@functools.lru_cache(maxsize=8)
def _cache_path(text: str) -> Path:
    return Path(text).expanduser() if text else Path.home() / ".cache" / "gnn_fastpath" / "tuning.json"


def _pow2(x: float) -> int:
    """x rounded to the nearest power of two on a log scale (0 stays 0)."""
    return 0 if x <= 0 else 1 << max(0, round(math.log2(x)))


def size_class(decision: str, n_src: int, n_dst: int, num_edges: int, width: int, dtype: torch.dtype,
               long_row_chunks: int = 0) -> str:
    """The class a call's choice is shared by: ``decision`` (e.g. ``"dot_attention.backward"``),
    node and edge counts, mean in- and out-degree and the degree skew (``long_row_chunks``:
    the chunks the work list cut long destination rows into, 0 without such rows) to the
    nearest power of two, the row width (H * D or F) and the dtype. Two graphs of one size
    and mean degree, one with uniform in-degrees and one with super nodes, are two classes."""
    deg_in = num_edges / max(n_dst, 1)
    deg_out = num_edges / max(n_src, 1)
    return (f"{decision}|src~{_pow2(n_src)}|dst~{_pow2(n_dst)}|edges~{_pow2(num_edges)}"
            f"|in~{_pow2(deg_in)}|out~{_pow2(deg_out)}|long-row chunks~{_pow2(long_row_chunks)}"
            f"|width {width}|{str(dtype).replace('torch.', '')}")


def device_key(device: torch.device) -> str:
    """What a choice is valid for: the GPU model and the gnn_fastpath and torch versions."""
    index = (device.index if device.index is not None else torch.cuda.current_device()) if device.type == "cuda" else -1
    return _device_key(device.type, index)


@functools.lru_cache(maxsize=None)
def _device_key(kind: str, index: int) -> str:
    from . import __version__

    name = torch.cuda.get_device_name(index) if kind == "cuda" else kind
    return f"{name}|gnn_fastpath {__version__}|torch {torch.__version__}"


def _read(path: Path) -> dict:
    """The file's entries ({device key: {class: record}}); empty when absent, unreadable or of
    another format."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return data["entries"]


def _entries(path: Path) -> dict:
    key = str(path)
    if key not in _loaded:
        _loaded[key] = _read(path)
    return _loaded[key]


def _write(path: Path, dkey: str, klass: str, record: dict) -> None:
    """Add one record, merged into what the file holds now (another process may have written),
    by an atomic replace; a file that cannot be written leaves the choice in this process only."""
    entries = _read(path)
    entries.setdefault(dkey, {})[klass] = record
    _loaded[str(path)] = entries
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:  # written but not moved into place
            try:
                os.unlink(tmp)
            except OSError:
                pass


def remembered(klass: str, device: torch.device) -> Optional[str]:
    """The choice remembered for ``klass`` on this GPU and version, or None."""
    with _lock:
        record = _entries(cache_path()).get(device_key(device), {}).get(klass)
    return record["choice"] if isinstance(record, dict) and "choice" in record else None


def _time_ms(run: Callable[[], object], device: torch.device) -> float:
    """One sample: milliseconds per call of :data:`CALLS` back-to-back calls of ``run``
    (device events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / CALLS
    t0 = time.perf_counter()
    for _ in range(CALLS):
        run()
    return (time.perf_counter() - t0) * 1e3 / CALLS


def may_measure(device: torch.device) -> bool:
    """Whether a call may time variants now: tuning on, and no CUDA graph being captured."""
    if not enabled():
        return False
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def choose(klass: str, candidates: Mapping[str, Callable[[], object]], default: str, device: torch.device,
           timer: Optional[Callable[[Callable[[], object], torch.device], float]] = None) -> str:
    """The variant of ``candidates`` (name -> a run of the call with that variant) for ``klass``.

    Tuning off, or a CUDA graph being captured: the remembered choice if there is one, else
    ``default``. Otherwise the remembered choice, or every candidate timed in :data:`ROUNDS`
    rounds (``timer(run, device)`` gives one sample; default :func:`_time_ms`, after one
    untimed call of each), the fastest median (ties: the default) kept in this process and in
    the choices file.
    """
    if default not in candidates:
        raise ValueError(f"default {default!r} is not one of the candidates {sorted(candidates)}")
    if not enabled():
        return default
    found = remembered(klass, device)
    if found in candidates:
        return found
    if not may_measure(device):
        return default
    samples: Dict[str, List[float]] = {name: [] for name in candidates}
    try:
        if timer is None:
            timer = _time_ms
            for run in candidates.values():  # untimed: compiles and warms each variant
                run()
        for _ in range(ROUNDS):
            for name, run in candidates.items():
                samples[name].append(float(timer(run, device)))
    except torch.OutOfMemoryError:
        # timing holds the call's own buffers and one variant's more: a call that fits without
        # tuning must not fail because of it
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return default
    times = {name: sorted(v)[len(v) // 2] for name, v in samples.items()}
    best = min(times, key=lambda name: (times[name], name != default))
    remember(klass, device, best, times, default)
    return best


def remember(klass: str, device: torch.device, choice: str, times_ms: Mapping[str, float], default: str) -> None:
    """Keep a choice measured elsewhere (the SpMM algorithm search) in the choices file, as
    :func:`choose` keeps its own: ``times_ms`` per candidate, ``default`` the rule's pick."""
    record = {"choice": choice, "times_ms": dict(times_ms), "default": default,
              "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with _lock:
        _write(cache_path(), device_key(device), klass, record)


def choose_on_graph(graph, key: tuple, klass: Callable[[], str], device: torch.device,
                    run: Callable[[str], object], variants, default: str) -> str:
    """:func:`choose` for one call of a kernel family on ``graph``: one candidate per name of
    ``variants`` (``run(name)`` does the call with that variant), ``default`` the family's
    rule, ``klass()`` the call's :func:`size_class` (computed only when the graph has no
    choice yet). A measured (or remembered) choice is also kept on ``graph`` under ``key`` (the
    call's decision, width and dtype), so that the next calls on the graph cost one dictionary
    lookup: a step that is short on the GPU is bound by host time, which must not grow with
    tuning on."""
    memo = ("tuned", key, cache_path())
    found = graph.memo_get(memo)
    if found is not None:
        return found
    name = klass()
    chosen = choose(name, {v: (lambda v=v: run(v)) for v in variants}, default, device)
    if remembered(name, device) == chosen:  # a rule's default (nothing measured yet) is not kept
        graph.memo_set(memo, chosen)
    return chosen


def listing(all_devices: bool = False) -> List[dict]:
    """The remembered choices (the debug listing): one dict per class with ``device``,
    ``class``, ``choice``, ``default`` and ``times_ms``; by default only those valid here (this
    GPU, this version), with ``all_devices`` every one in the file."""
    with _lock:
        entries = _read(cache_path())
    here = device_key(torch.device("cuda")) if torch.cuda.is_available() else None
    rows = []
    for dkey, classes in sorted(entries.items()):
        if not all_devices and dkey != here:
            continue
        for klass, record in sorted(classes.items()):
            rows.append({"device": dkey, "class": klass, **record})
    return rows


def forget() -> None:
    """Drop what this process has read from choices files (they are read again on next use)."""
    with _lock:
        _loaded.clear()
