"""Counters of what the patched layers did: fused calls by backend, fallbacks by reason.

Every fallback also warns once per (layer, reason) with :class:`FastpathFallbackWarning`, so
a user notices a slow path without being flooded; :func:`reset_stats` clears counters and
re-arms the warnings. The reasons are the keys of :mod:`gnn_fastpath.ops.dispatch` (``dtype``,
``cpu``, ``no_kernel``, ...), of the framework checks in ``integrations/shim.py``
(``autocast``, ``hooks``, ``subclass``, ...) and of each layer's ``Unsupported("...")``; the
README section "Check it is working" lists them all with their meaning (a test keeps that
table in step with the code). ``stats(tuning=True)`` adds what tuning cost, where and how
much, beside the layers under ``"tuning"`` (:func:`gnn_fastpath.tuning.report`);
``stats(plans=True)`` the kernel plans that ran, under ``"plans"``
(:func:`gnn_fastpath.cuda.plans.report`).
"""
from __future__ import annotations

import copy
import threading
import warnings
from collections import defaultdict
from typing import Dict

_lock = threading.Lock()
_counts: Dict[str, Dict[str, Dict[str, int]]] = {}
_warned: set = set()
# (layer, reason) -> [count]: fallbacks counted without the lock (fallback_cell)
_cells: Dict[tuple, list] = {}


class FastpathFallbackWarning(UserWarning):
    """A patched layer ran its stock code instead of the fused path."""


# This module already warns once per (layer, reason); Python's default once-per-call-site
# registry would otherwise swallow the re-armed warning after reset_stats(). Appended, so a
# user's own filter for this category still wins.
warnings.filterwarnings("always", category=FastpathFallbackWarning, append=True)


def _entry(layer: str) -> Dict[str, Dict[str, int]]:
    entry = _counts.get(layer)
    if entry is None:
        entry = _counts[layer] = {"fused": defaultdict(int), "fallback": defaultdict(int)}
    return entry


def record_fused(layer: str, backend: str) -> None:
    with _lock:
        _entry(layer)["fused"][backend] += 1


def record_fallback(layer: str, reason: str, detail: str = "", warn: bool = True) -> None:
    """A patched layer ran its stock forward for ``reason``; warned once per (layer, reason)
    unless ``warn`` is False (a choice for speed, e.g. ``small_graph``, not a limit)."""
    with _lock:
        _entry(layer)["fallback"][reason] += 1
        first = warn and (layer, reason) not in _warned
        _warned.add((layer, reason))
    if first:
        msg = f"gnn_fastpath: {layer} runs its stock forward ({reason}"
        msg += f": {detail})" if detail else ")"
        warnings.warn(msg + "; warned once per layer and reason", FastpathFallbackWarning, stacklevel=4)


def fallback_cell(layer: str, reason: str) -> list:
    """A counter of ``layer``'s stock calls for ``reason`` that a hot path increments itself
    (``cell[0] += 1``, no lock, no warning: a choice for speed such as ``small_graph``), read
    into :func:`stats` as ``cell[0] - cell[1]``; :func:`reset_stats` moves the baseline
    ``cell[1]`` and never writes the count. Without the lock, increments from several threads
    at once may be lost: for the per-call path of the small-graph rule's memo, where the lock
    and the nested counters showed in host-bound sampled steps."""
    with _lock:
        cell = _cells.get((layer, reason))
        if cell is None:
            cell = _cells[(layer, reason)] = [0, 0]
    return cell


def record_compiled(layer: str, outcome: str) -> None:
    """A patched layer traced by ``torch.compile``: ``outcome`` is the backend its custom
    operators run on (``"cuda"``/``"reference"``), ``"eager"`` (a DGL layer: its eager path
    runs at a graph break, counted per call under ``fused`` / ``fallback``) or
    ``"fallback:<reason>"``. Called while
    dynamo traces, so it counts compiled graphs, not calls; no lock (dynamo cannot trace one)."""
    compiled = _entry(layer).setdefault("compiled", defaultdict(int))
    compiled[outcome] += 1


def stats(tuning: bool = False, plans: bool = False) -> Dict[str, Dict[str, Dict[str, int]]]:
    """Per layer class, fused calls by backend and fallbacks by reason, as plain data.

    Example: ``{"pyg.TransformerConv": {"fused": {"cuda": 12, "reference": 0},
    "fallback": {"cpu": 3}}}``. Both backends are always listed under ``"fused"``:
    ``"cuda"`` counts calls on the fused kernels, ``"reference"`` calls of the fused path on
    the pure-PyTorch reference ops (``enable(cpu="reference")``, ``force_reference()``).
    ``"fallback"`` counts calls that ran the stock forward, by reason (the README's "Check it
    is working" table says what each reason means). A layer appears once it has been called
    while patched.

    With ``tuning=True`` the result also holds ``"tuning"``: where the tuner spent time since
    the last :func:`reset_stats` and how much, per size class and in all, with its budget
    (:func:`gnn_fastpath.tuning.report`): ``{"ms": ..., "trials": ..., "budget_ms": ...,
    "budget_left_ms": ..., "classes": {"<size class>": {"op": ..., "state": ..., "calls": ...,
    "trials": ..., "ms": ..., ...}}}`` (a key asked for, so that code reading every other value
    as a layer's counts keeps working).

    With ``plans=True`` the result also holds ``"plans"``: the kernel plans that ran since the
    last :func:`reset_stats`, per kernel family, each with its pass, its key (the call
    signature it is cached under on the Graph: shapes, dtypes, alignment, the settings, the
    graph's state), its calls, how many were built for that key (one per graph) and the plan
    (variant, what decided it, the rule's pick, its parameters, a pending tuner choice)
    (:func:`gnn_fastpath.cuda.plans.report`).
    """
    with _lock:
        out = {}
        for layer, entry in _counts.items():
            fused = {"cuda": 0, "reference": 0}
            fused.update(entry["fused"])
            out[layer] = {"fused": fused, "fallback": dict(entry["fallback"])}
            if "compiled" in entry:
                out[layer]["compiled"] = dict(entry["compiled"])
        for (layer, reason), cell in _cells.items():
            count = cell[0] - cell[1]
            if count:
                fallback = out.setdefault(layer, {"fused": {"cuda": 0, "reference": 0}, "fallback": {}})["fallback"]
                fallback[reason] = fallback.get(reason, 0) + count
        out = copy.deepcopy(out)
    if tuning:
        from . import tuning as tuner

        out["tuning"] = tuner.report()
    if plans:
        from .cuda import plans as planner

        out["plans"] = planner.report()
    return out


def reset_stats() -> None:
    """Clear all counters, re-arm the once-per-reason fallback warnings and restart the tuning
    report (:func:`gnn_fastpath.tuning.reset_report`: the tuner's budget and choices stay) and
    the plans report (:func:`gnn_fastpath.cuda.plans.reset_report`: cached plans stay)."""
    from . import tuning
    from .cuda import plans

    with _lock:
        _counts.clear()
        _warned.clear()
        for cell in _cells.values():  # kept: the memos that count into them hold them
            cell[1] = cell[0]
    tuning.reset_report()
    plans.reset_report()
