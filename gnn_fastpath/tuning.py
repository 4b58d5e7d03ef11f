"""Measured choices between kernel variants, made per size class, kept across processes, paid
for out of a bounded budget.

Several kernel families have variants whose order of speed depends on the graph and the
width (a backward with atomics or a source-major pass, feature chunks per lane, ...). Rules
pick one before and without tuning (each family's ``backward_mode``, ``rule_chunks``, ...;
``GNN_FASTPATH_TUNE=0`` keeps them). With ``GNN_FASTPATH_TUNE=1`` (the default) the tuner
times the variants of a *size class* on the calls' own inputs and keeps the fastest:

- a size class (:func:`size_class`) is the op's decision, the node and edge counts, the
  mean degrees and the degree skew rounded to powers of two, the row width and the dtype:
  graphs of one class share the choice, and a training run's mini-batches fall into a few
  classes;
- choices are written to a small JSON file (``GNN_FASTPATH_TUNE_CACHE``, default
  ``~/.cache/gnn_fastpath/tuning.json``) under a key naming the GPU model, the gnn_fastpath
  and torch versions (:func:`device_key`), so the next process does not time again, and a
  choice timed on another GPU or another version is never used;
- :func:`listing` shows every choice in the file (the debug listing), with its timings and
  what measuring it cost.

Where tuning time goes
----------------------
Into :func:`choose` (the launchers reach it through their plans, :mod:`gnn_fastpath.cuda.plans`,
and :func:`choice_on_graph`), on calls of a
class that has no choice yet, as *extra* calls of the op on the call's own inputs (their
results are dropped; the call itself then runs the chosen variant, or the rule's pick). What
a launcher prepares before asking (GATv2's symmetry detection on a graph used again) is its
own, once per graph, and not counted here.

1. the *probe*, at the class's first call: the rule's variant twice, a warm-up (it compiles
   and builds what the variant needs, once) and a timed call: ``t_rule``, what one call of
   the class costs. Two extra calls, counted as 2 x ``t_rule``: what the warm-up does once
   (compile, set-up) the call itself would have done, as it runs the rule's variant too.
2. the *race*: one warm-up call of each other variant, then rounds of one sample each
   (:data:`CALLS` back-to-back calls between CUDA events, synchronised) for the variants still
   in the race; after each round a variant more than :data:`CLEAR` slower than the fastest
   leaves it; the race ends with one variant left or after :data:`ROUNDS` rounds. The fastest
   median of the variants still in the race wins (the record keeps every variant's median and
   its ``rounds``), except that the rule's pick stays unless it is beaten by more than :data:`TIE`.

The bound
---------
A class's race starts only once its estimated cost (every variant at ``t_rule``, every round
run) fits the class's allowance: :data:`FREE_MS` + :data:`SHARE` x (the class's calls so far)
x ``t_rule``, less what the class has spent already (its probe). Until then its calls run the
rule's pick at no extra cost. So a race estimated under FREE_MS (small graphs, sampled
batches) is run at the class's first call, and a larger one waits until the class's own calls
have taken about estimate / SHARE: apart from the probe and FREE_MS, tuning a class costs
about SHARE of the time its calls took before the race (off by the estimate's error: variants
slower than the rule's pick cost more than estimated, variants that leave the race early
less); a short training run pays the probes alone, and the races that fit FREE_MS. Over all classes, a process spends at
most :data:`BUDGET_MS` on probes and races (a probe, whose cost is known only once it ran,
may overshoot it by its two calls); a class whose race no longer fits what is left
keeps the rule for the rest of the process (nothing is written: a later process may measure
it). Nothing is timed while a CUDA graph is being captured or on the compiled path's static
graphs (those read a remembered choice or the rule), and a variant running out of GPU memory
while timed leaves its class on the rule for the rest of the process.

Reporting
---------
:func:`report`, also ``gnn_fastpath.stats(tuning=True)["tuning"]``: per class (where), its op,
state, calls, the extra calls the tuner ran (``trials``) and their milliseconds (how much:
CUDA-event time of every extra call, which includes what the GPU waits for while the host
compiles a race warm-up's kernels or builds what that variant needs; the probe as above; the
host's waits for the synchronised samples are not counted), ``t_rule``, the rule's pick, the choice and its timings; and the
totals with what is left of the budget.
``gnn_fastpath.reset_stats()`` restarts the report, not the budget. The SpMM algorithm search
(:mod:`gnn_fastpath.cuda.cusparse`), which times its own candidates whatever this module
decides, reports the milliseconds of its timed runs through :func:`remember` (outside the
budget).
"""
from __future__ import annotations

import functools
import json
import math
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch

from . import config

#: Version of the file layout; a file of another version is ignored (and replaced on write).
FORMAT = 1
#: Most rounds of a race: each round times every variant still in it once, in turn (so drift
#: hits them alike); a variant's median over its rounds counts.
ROUNDS = 3
#: Calls per timed sample of the race, back to back: a call that is short on the GPU is then
#: timed by its kernels more than by the gaps while the host launches them.
CALLS = 2
#: After a round, a variant whose median is more than this fraction above the fastest leaves
#: the race (a clear loser is not timed again).
CLEAR = 0.10
#: The rule's pick is kept unless another variant's median beats it by more than this fraction
#: (differences within the timing noise do not override the rule).
TIE = 0.02
#: Share of a class's call time (calls so far x ``t_rule``) its race may cost: the allowance
#: grows by this much per call.
SHARE = 0.05
#: Milliseconds of race every class may spend from its first call on (small problems are
#: measured at once).
FREE_MS = 5.0
#: Milliseconds a process may spend on probes and races over all classes.
BUDGET_MS = 5000.0

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


# ----------------------------------------------------------------------------------------
# The tuner's state in this process: per class, its calls, probe, spending and outcome.

#: States of a class (``report()["classes"][...]["state"]``).
WAITING = "waiting"            # probed; its calls take the rule's pick until the race fits
MEASURED = "measured"          # raced in this process; the choice is kept in the file
REMEMBERED = "remembered"      # the choice came from the file (measured by an earlier process)
OVER_BUDGET = "over budget"    # the process budget is spent: the rule, for the rest of the process
OUT_OF_MEMORY = "out of memory"  # a variant ran out of GPU memory while timed: the rule, likewise
SEARCHED = "searched"          # the SpMM algorithm search (its own timing, reported via remember())
RULE = "rule"                  # nothing measured yet (tuning could not time: a CUDA graph capture)


@dataclass
class _Class:
    klass: str
    default: str
    calls: int = 0               # calls of the class that asked the tuner
    trials: int = 0              # extra calls of the op the tuner ran (probe, warm-ups, samples)
    ms: float = 0.0              # their milliseconds
    t_rule: Optional[float] = None
    n_variants: int = 0
    state: str = RULE
    choice: Optional[str] = None
    times: Dict[str, float] = field(default_factory=dict)
    busy: bool = False
    base: Tuple[int, int, float] = (0, 0, 0.0)  # (calls, trials, ms) when the report restarted


_classes: Dict[Tuple[str, str, str], _Class] = {}
# spent: probes and races (what BUDGET_MS caps); total: also the SpMM searches; base: at the
# report's restart
_spent = {"ms": 0.0, "trials": 0, "total_ms": 0.0, "total_trials": 0, "base_ms": 0.0, "base_trials": 0}


def _state(path: Path, dkey: str, klass: str, default: str) -> _Class:
    """The class's state (created on first use); call with the lock held."""
    key = (str(path), dkey, klass)
    st = _classes.get(key)
    if st is None:
        st = _classes[key] = _Class(klass, default)
    return st


def _charge(st: _Class, ms_per_call: float, calls: int, budget: bool = True) -> None:
    """Count ``calls`` extra calls of ``ms_per_call`` milliseconds each against ``st`` (and,
    with ``budget``, against the process budget)."""
    ms = float(ms_per_call) * calls
    with _lock:
        st.ms += ms
        st.trials += calls
        _spent["total_ms"] += ms
        _spent["total_trials"] += calls
        if budget:
            _spent["ms"] += ms
            _spent["trials"] += calls


def _time_ms(run: Callable[[], object], device: torch.device, calls: int = CALLS) -> float:
    """One sample: milliseconds per call of ``calls`` back-to-back calls of ``run`` (device
    events on a GPU, synchronised: the host waits for the sample)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - t0) * 1e3 / calls


def may_measure(device: torch.device) -> bool:
    """Whether a call may time variants now: tuning on, and no CUDA graph being captured."""
    if not enabled():
        return False
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def race_estimate_ms(t_rule: float, n_variants: int) -> float:
    """What a race of ``n_variants`` is estimated to cost when one call takes ``t_rule``: a
    warm-up of every variant but the rule's, and :data:`ROUNDS` samples of :data:`CALLS`
    calls of each."""
    return t_rule * ((n_variants - 1) + n_variants * CALLS * ROUNDS)


def allowance_ms(calls: int, t_rule: float, spent_ms: float) -> float:
    """What a class may still spend: :data:`FREE_MS` + :data:`SHARE` x its ``calls`` x
    ``t_rule``, less the ``spent_ms`` it has spent."""
    return FREE_MS + SHARE * calls * t_rule - spent_ms


Timer = Callable[[Callable[[], object], torch.device, int], float]


def choose(klass: str, candidates: Mapping[str, Callable[[], object]], default: str, device: torch.device,
           timer: Optional[Timer] = None) -> str:
    """The variant of ``candidates`` (name -> a run of the call with that variant) this call of
    ``klass`` takes; ``default`` is the rule's pick.

    Tuning off: ``default``. Else the choice made in this process or remembered in the file;
    else, once the class's race fits its allowance and the process budget (see the module
    docstring), the race's winner, kept in this process and in the file; until then
    ``default``, after a probe at the class's first call. A CUDA graph being captured times
    nothing. ``timer(run, device, calls)`` gives one sample, milliseconds per call (default
    :func:`_time_ms`); the warm-up calls go through it too (``calls`` 1): a race warm-up's
    time is counted as measured, the probe's as one call of ``t_rule``.
    """
    return _choose(klass, candidates, default, device, timer)[0]


def _choose(klass: str, candidates: Mapping[str, Callable[[], object]], default: str, device: torch.device,
            timer: Optional[Timer]) -> Tuple[str, bool]:
    """(the variant for this call, whether it is final in this process: a later call of the
    class gets the same without asking)."""
    if default not in candidates:
        raise ValueError(f"default {default!r} is not one of the candidates {sorted(candidates)}")
    if not enabled():
        return default, False
    path, dkey = cache_path(), device_key(device)
    with _lock:
        st = _state(path, dkey, klass, default)
        st.calls += 1
        if st.choice is not None:
            return (st.choice, True) if st.choice in candidates else (default, False)
        if st.state in (OVER_BUDGET, OUT_OF_MEMORY):
            return default, True
        record = _entries(path).get(dkey, {}).get(klass)
        found = record.get("choice") if isinstance(record, dict) else None
        if found in candidates:
            st.state, st.choice = REMEMBERED, found
            st.times = dict(record.get("times_ms") or {})
            return found, True
        if st.busy or not may_measure(device):
            return default, False
        if _spent["ms"] >= BUDGET_MS:
            st.state = OVER_BUDGET
            return default, True
        st.busy = True
    try:
        return _measure(path, dkey, st, candidates, default, device, timer or _time_ms)
    finally:
        st.busy = False


def _measure(path: Path, dkey: str, st: _Class, candidates: Mapping[str, Callable[[], object]], default: str,
             device: torch.device, timer: Timer) -> Tuple[str, bool]:
    """The probe (first time), then the race if it fits; see :func:`_choose`."""
    st.n_variants = len(candidates)
    try:
        if st.t_rule is None:
            run = candidates[default]
            timer(run, device, 1)  # warm-up: compiles, builds what the variant needs
            t_rule = float(timer(run, device, 1))
            # what the warm-up did once would have been done by the call itself (it runs the
            # rule's variant too): it costs the class one call more, not its first call's time
            _charge(st, t_rule, 2)
            st.t_rule, st.state = t_rule, WAITING
        if len(candidates) == 1:
            best, times = default, {default: st.t_rule}
        else:
            estimate = race_estimate_ms(st.t_rule, len(candidates))
            if estimate > allowance_ms(st.calls, st.t_rule, st.ms):
                return default, False
            if estimate > BUDGET_MS - _spent["ms"]:  # never fits any more: the budget only shrinks
                st.state = OVER_BUDGET
                return default, True
            best, times, rounds = _race(st, candidates, default, device, timer)
    except torch.OutOfMemoryError:
        # timing holds the call's own buffers and one variant's more: a call that fits without
        # tuning must not fail because of it
        if device.type == "cuda":
            torch.cuda.empty_cache()
        st.state = OUT_OF_MEMORY
        return default, True
    st.choice, st.times, st.state = best, times, MEASURED
    record = {"choice": best, "times_ms": dict(times), "rounds": rounds, "default": default,
              "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "cost_ms": round(st.ms, 3), "trials": st.trials, "calls_before": st.calls}
    with _lock:
        _write(path, dkey, st.klass, record)
    return best, True


def _race(st: _Class, candidates: Mapping[str, Callable[[], object]], default: str, device: torch.device,
          timer: Timer) -> Tuple[str, Dict[str, float], Dict[str, int]]:
    """The race (module docstring): (winner, median ms per call of every variant timed, rounds
    each variant stayed in). The winner is judged among the variants still in the race at its
    end, on their medians over every round: a variant that left early has a median of fewer,
    earlier samples, which drift (clocks, other work on the GPU) can make look faster."""
    for name, run in candidates.items():
        if name != default:  # the rule's variant was warmed by the probe
            _charge(st, timer(run, device, 1), 1)
    live = list(candidates)
    samples: Dict[str, List[float]] = {name: [] for name in candidates}
    for _ in range(ROUNDS):
        for name in live:
            t = float(timer(candidates[name], device, CALLS))
            _charge(st, t, CALLS)
            samples[name].append(t)
        medians = {name: statistics.median(samples[name]) for name in live}
        fastest = min(medians.values())
        live = [name for name in live if medians[name] <= (1 + CLEAR) * fastest]
        if len(live) == 1:
            break
    times = {name: statistics.median(v) for name, v in samples.items() if v}
    rounds = {name: len(v) for name, v in samples.items() if v}
    best = min(live, key=lambda name: (times[name], name != default))
    if default in live and times[default] <= (1 + TIE) * times[best]:
        best = default
    return best, times, rounds


def remember(klass: str, device: torch.device, choice: str, times_ms: Mapping[str, float], default: str,
             cost_ms: Optional[float] = None, trials: Optional[int] = None) -> None:
    """Keep a choice measured elsewhere (the SpMM algorithm search) in the choices file, as
    :func:`choose` keeps its own: ``times_ms`` per candidate, ``default`` the rule's pick;
    ``cost_ms`` and ``trials`` what measuring it cost (default: the sum of ``times_ms`` and one
    trial per candidate, i.e. the timed runs alone). Reported by :func:`report` (state
    ``searched``), outside the process budget: the search runs whatever the tuner decides."""
    cost = float(sum(times_ms.values()) if cost_ms is None else cost_ms)
    n = len(times_ms) if trials is None else int(trials)
    record = {"choice": choice, "times_ms": dict(times_ms), "default": default,
              "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "cost_ms": round(cost, 3), "trials": n}
    path, dkey = cache_path(), device_key(device)
    with _lock:
        _write(path, dkey, klass, record)
        st = _state(path, dkey, klass, default)
        st.calls += 1
        st.state, st.choice, st.times = SEARCHED, choice, dict(times_ms)
        st.ms += cost
        st.trials += n
        _spent["total_ms"] += cost
        _spent["total_trials"] += n


def choose_on_graph(graph, key: tuple, klass: Callable[[], str], device: torch.device,
                    run: Callable[[str], object], variants, default: str) -> str:
    """:func:`choose` for one call of a kernel family on ``graph``: one candidate per name of
    ``variants`` (``run(name)`` does the call with that variant), ``default`` the family's
    rule, ``klass()`` the call's :func:`size_class` (computed once per graph and ``key``). A
    final choice (measured, remembered, or the rule for the rest of the process) is also kept
    on ``graph`` under ``key`` (the call's decision, width and dtype), so that the next calls
    on the graph cost one dictionary lookup: a step that is short on the GPU is bound by host
    time, which must not grow with tuning on. While a class waits for its race, each call
    asks again (a few lookups), which counts its calls. The launchers reach it through their
    plans (:func:`gnn_fastpath.cuda.plans.run`, via :func:`choice_on_graph`)."""
    return choice_on_graph(graph, key, klass, device, run, variants, default)[0]


def choice_on_graph(graph, key: tuple, klass: Callable[[], str], device: torch.device,
                    run: Callable[[str], object], variants, default: str) -> Tuple[str, bool]:
    """:func:`choose_on_graph`'s (variant, whether it is final): a final choice is what every
    later call of ``key`` on ``graph`` gets without asking (a plan then keeps it)."""
    memo = ("tuned", key, cache_path())
    found = graph.memo_get(memo)
    if found is not None:
        return found, True
    name_key = ("tuning class", key)
    name = graph.memo_get(name_key)
    if name is None:
        name = klass()
        graph.memo_set(name_key, name)
    chosen, final = _choose(name, {v: (lambda v=v: run(v)) for v in variants}, default, device, None)
    if final:
        graph.memo_set(memo, chosen)
    return chosen, final


def report() -> dict:
    """What tuning cost since the report last restarted (:func:`reset_report`; the process
    start, :func:`forget`): ``ms`` and ``trials`` (extra calls of ops) in all, ``budget_ms``
    and ``budget_left_ms`` (the process budget, which the report's restart does not refill),
    and ``classes``: per size class called since then, its ``op``, ``state`` (``waiting``,
    ``measured``, ``remembered``, ``over budget``, ``out of memory``, ``searched``, ``rule``),
    ``calls``, ``trials``, ``ms``, ``t_rule_ms`` (one call of the rule's variant, from the
    probe), ``allowance_ms`` (what its race may cost now, while it waits), ``race_estimate_ms``,
    ``default`` (the rule's pick), ``choice`` and ``times_ms`` (the race's medians, or the
    remembered ones)."""
    with _lock:
        classes = {}
        for (_, dkey, klass), st in sorted(_classes.items()):
            calls, trials, ms = st.calls - st.base[0], st.trials - st.base[1], st.ms - st.base[2]
            if calls <= 0 and trials <= 0:
                continue
            entry = {"op": klass.split("|")[0], "state": st.state, "calls": calls, "trials": trials,
                     "ms": round(ms, 4), "t_rule_ms": None if st.t_rule is None else round(st.t_rule, 4),
                     "default": st.default, "choice": st.choice,
                     "times_ms": {k: round(v, 4) for k, v in st.times.items()}}
            if st.state == WAITING:
                entry["allowance_ms"] = round(allowance_ms(st.calls, st.t_rule, st.ms), 4)
                entry["race_estimate_ms"] = round(race_estimate_ms(st.t_rule, st.n_variants), 4)
            name = klass if klass not in classes else f"{klass} [{dkey}]"
            classes[name] = entry
        return {"ms": round(_spent["total_ms"] - _spent["base_ms"], 4),
                "trials": _spent["total_trials"] - _spent["base_trials"],
                "budget_ms": BUDGET_MS, "budget_left_ms": round(max(0.0, BUDGET_MS - _spent["ms"]), 4),
                "classes": classes}


def reset_report() -> None:
    """Restart :func:`report` (``gnn_fastpath.reset_stats()`` does): counts from now on; the
    budget and every class's state and allowance are kept."""
    with _lock:
        for st in _classes.values():
            st.base = (st.calls, st.trials, st.ms)
        _spent["base_ms"], _spent["base_trials"] = _spent["total_ms"], _spent["total_trials"]


def listing(all_devices: bool = False) -> List[dict]:
    """The remembered choices (the debug listing): one dict per class with ``device``,
    ``class``, ``choice``, ``default``, ``times_ms`` and what measuring it cost (``cost_ms``,
    ``trials``); by default only those valid here (this GPU, this version), with
    ``all_devices`` every one in the file."""
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
    """Start over as a new process would: drop what this process has read from choices files
    (they are read again on next use) and the tuner's state (classes, probes, spending: the
    budget is whole again, the report empty)."""
    with _lock:
        _loaded.clear()
        _classes.clear()
        for k in _spent:
            _spent[k] = 0 if k.endswith("trials") else 0.0
