"""Every ``GNN_FASTPATH_*`` setting in one place, and the run-time switches of the backends.

Environment variables. One rule: a variable is read each time the setting it controls is
used (an op call, a probe, ``enable()``), through :func:`setting` (or :func:`settings`), so a
change takes effect at the next call and tests can set variables with ``monkeypatch.setenv``.
Values are validated on read; a bad value raises a ValueError naming the variable.
:data:`SETTINGS` is the table of them all (the README's "Switches" table lists the same rows; a
test keeps the two in step).

Run-time switches (no environment): ``enable(cpu=...)`` sets :func:`cpu_mode` for the whole
process; :func:`force_reference` forces the reference ops in the current thread. The one
dispatch (:mod:`gnn_fastpath.ops.dispatch`) reads both.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Tuple


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, default (as the text a user would write), the
    values it takes (a tuple of choices, or a description for free-form values), what it
    does, and the parser turning the text into the value the code uses."""

    name: str
    default: str
    values: str
    effect: str
    parse: Callable[[str, str], object]


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {text!r}")
        return value

    return parse


def _int_in(lo: int, hi: int, allowed: Tuple[int, ...] = ()) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"{name} must be an integer; got {text!r}") from None
        if allowed and value not in allowed or not lo <= value <= hi:
            want = ", ".join(map(str, allowed)) if allowed else f"{lo}..{hi}"
            raise ValueError(f"{name} must be {want}; got {text!r}")
        return value

    return parse


def _optional_int_in(lo: int, hi: int, allowed: Tuple[int, ...] = ()) -> Callable[[str, str], object]:
    parse_int = _int_in(lo, hi, allowed)

    def parse(name: str, text: str):
        return None if not text.strip() else parse_int(name, text)

    return parse


def _flag(name: str, text: str) -> bool:
    """'0', 'false', 'off', 'no' (any case) are off; '1', 'true', 'on', 'yes' are on."""
    value = text.strip().lower()
    if value in ("0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes"):
        return True
    raise ValueError(f"{name} must be 0/1 (or true/false, on/off, yes/no); got {text!r}")


def _text(name: str, text: str) -> str:
    return text.strip()


def _optional_choice(*choices: str) -> Callable[[str, str], object]:
    parse_choice = _choice(*choices)

    def parse(name: str, text: str):
        return None if not text.strip() else parse_choice(name, text)

    return parse


#: Every environment variable the package reads, in README order.
SETTINGS = (
    Setting("GNN_FASTPATH", "1", "0 or 1", "0 makes `enable()` a no-op (A/B runs without editing code)", _flag),
    Setting("GNN_FASTPATH_DISABLE_CUDA", "0", "0 or 1",
            "1 reports the CUDA kernels unavailable: every op runs its reference, shims on CUDA fall back",
            _flag),
    Setting("GNN_FASTPATH_SMALL_GRAPH", "auto", "auto, off",
            "auto: a patched layer whose fused path is measured slower than stock on small graphs runs stock "
            "below its crossover edge count (stats() reason small_graph; see the README); off: the fused path "
            "at every size", _choice("auto", "off")),
    Setting("GNN_FASTPATH_NEW_GRAPH", "exact", "exact, static",
            "how a PyG layer builds the graph of an edge_index it has not seen: exact reads the graph's degree "
            "facts back once (one host synchronisation; degree-aware work lists, node ids checked on the host); "
            "static builds it as torch.compile does (no host synchronisation: work lists sized from shapes, node "
            "ids checked on the device, replaced self loops kept in an extra row) for its first calls, then exact",
            _choice("exact", "static")),
    Setting("GNN_FASTPATH_GATV2_CHUNK", "256", "1..65536",
            "GATv2 attention: rows longer than this many edges are cut into chunks of this length",
            _int_in(1, 65536)),
    Setting("GNN_FASTPATH_GATV2_BWD", "", "atomic, transposed, fused (empty: by graph, or timed)",
            "GATv2 backward: source gradient by atomics in the destination pass, or a source-major pass, or "
            "(undirected graphs; elsewhere transposed) both gradients in one pass over the forward CSR; empty: "
            "atomic, or fused for 16-bit rows on an undirected graph of at most 4 in-edges per node used again; "
            "timed on graphs used again with GNN_FASTPATH_TUNE=1",
            _optional_choice("atomic", "transposed", "fused")),
    Setting("GNN_FASTPATH_DOT_BWD", "", "atomic, transposed, block (empty: by graph, or timed)",
            "dot attention backward: dk/dv by atomics or a source-major pass, or (16-bit, no edge term) "
            "both passes on tensor cores over the block-sparse layout; empty picks by graph",
            _optional_choice("atomic", "transposed", "block")),
    Setting("GNN_FASTPATH_DOT_FWD", "", "csr, block (empty: by graph, or timed)",
            "dot attention forward: the CSR kernels, or (16-bit, no edge term) tensor cores over the "
            "block-sparse layout; empty picks by graph",
            _optional_choice("csr", "block")),
    Setting("GNN_FASTPATH_GAT_BWD", "", "atomic, transposed (empty: by graph, or timed)",
            "GAT attention backward: source gradients by atomics or a source-major pass; empty: atomic, or on "
            "graphs used again the source-major pass for 16-bit rows with at most 16 out-edges per source on "
            "average, or where the longest destination row is at least 16 times the longest source row; timed with "
            "GNN_FASTPATH_TUNE=1",
            _optional_choice("atomic", "transposed")),
    Setting("GNN_FASTPATH_TUNE", "1", "0 or 1",
            "1 times kernel variants once per size class and keeps the fastest, remembered across processes: "
            "the forward and backward of dot attention and the backward of GAT and GATv2 attention (where "
            "GNN_FASTPATH_DOT_FWD / _DOT_BWD / _GAT_BWD / _GATV2_BWD are empty) and the "
            "min/max forward's feature chunks and backward scatter (where GNN_FASTPATH_SR_CHUNKS / _SR_BWD are empty), "
            "and keeps the SpMM algorithm "
            "search's choice in the same file; 0 uses the rules", _flag),
    Setting("GNN_FASTPATH_TUNE_CACHE", "", "a file path (empty: ~/.cache/gnn_fastpath/tuning.json)",
            "where the measured choices are kept, per GPU model and package version", _text),
    Setting("GNN_FASTPATH_SPMM_BWD", "auto", "auto, transposed, flag",
            "SpMM backward: dX = A^T dY on an explicit cached transpose, or cuSPARSE's transpose flag; "
            "auto: the flag in a graph's first training step (a sampled batch never builds the transpose), "
            "the transpose once the graph is used again",
            _choice("auto", "transposed", "flag")),
    Setting("GNN_FASTPATH_SPMM_ALG", "", "default, alg1, alg2, alg3, custom, block (empty: timed)",
            "SpMM algorithm: force one instead of timing cuSPARSE's CSR algorithms, the own kernel and "
            "(16-bit features) the block-sparse tensor-core kernel",
            _optional_choice("default", "alg1", "alg2", "alg3", "custom", "block")),
    Setting("GNN_FASTPATH_SPMM_CUSTOM", "1", "0 or 1",
            "0 leaves the own CSR SpMM kernel out of the timed choice (cuSPARSE only)", _flag),
    Setting("GNN_FASTPATH_SR_BWD", "", "atomic, transposed (empty: by graph, or timed with GNN_FASTPATH_TUNE=1)",
            "min/max backward (split/even): single winners' gradients by atomics, or a source-major pass without "
            "atomics (on a symmetric graph over the forward CSR)", _optional_choice("atomic", "transposed")),
    Setting("GNN_FASTPATH_SR_SCATTER", "", "rows, slices (empty: by graph)",
            "min/max backward's atomic scatter: row-major, or feature slices with the hub sources' rows "
            "copied (empty: slices where dx outgrows the L2 and F >= 64, on graphs that outlived a training "
            "step)",
            _optional_choice("rows", "slices")),
    Setting("GNN_FASTPATH_SR_CHUNKS", "",
            "1, 2, 4 (empty: 1, or 2 below 16 in-edges per destination, below 4 for 16-bit rows; timed "
            "with GNN_FASTPATH_TUNE=1)",
            "min/max reduction: feature chunks of 4 floats per lane", _optional_int_in(1, 4, (1, 2, 4))),
    Setting("GNN_FASTPATH_VEC16", "", "8, 16 (empty: per kernel family)",
            "bytes per vector access of 16-bit features (16: 8 halves per lane; 8: 4, the float32 lane layout); "
            "empty: 16 for dot attention, 8 for the others (see benchmarks/RESULTS.md)",
            _optional_choice("8", "16")),
)

_BY_NAME = {s.name: s for s in SETTINGS}
# name -> (the raw text last read, its parsed value): parsing is skipped while the text is unchanged
_parsed: dict = {}
# name -> os.environ's own key for it (see _raw)
_environ_keys: dict = {}
# names tuple -> (raw texts last read, their parsed values) (see settings)
_snapshots: dict = {}
# names tuple -> os.environ's own keys for them (see settings)
_snapshot_keys: dict = {}


def _raw(name: str):
    """The environment's current text of ``name`` as ``os.environ`` stores it (None: unset).

    Read from ``os.environ``'s own dict, the one ``os.environ.get`` reads: the same value
    without the Mapping interface's key encoding, value decoding and (for an unset variable)
    KeyError, which ops pay for several settings per call. Anything other than CPython's
    ``os._Environ`` is read through ``get``."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if data is None:
        return environ.get(name)
    key = _environ_keys.get(name)
    if key is None:
        key = _environ_keys[name] = environ.encodekey(name)
    return data.get(key)


def _text(raw) -> str:
    """The text of a raw environment value from :func:`_raw` ("" for unset)."""
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else os.environ.decodevalue(raw)


def _value(name: str, raw):
    """Setting ``name``'s parsed value for its raw text ``raw`` (parsed once per text)."""
    cached = _parsed.get(name)
    if cached is not None and cached[0] == raw:
        return cached[1]
    spec = _BY_NAME.get(name)
    if spec is None:
        raise KeyError(f"{name} is not a gnn_fastpath setting (known: {', '.join(_BY_NAME)})")
    text = _text(raw)
    value = spec.parse(name, text if text.strip() else spec.default)
    _parsed[name] = (raw, value)
    return value


def setting_slot(name: str):
    """``(mapping, key)`` such that ``mapping.get(key)`` is the environment's stored text of
    setting ``name`` (None: unset), as :func:`_raw` reads it, with one builtin call and no
    Python frame: os.environ's own dict and its encoded key, whose value stays the same object
    (``is``) while nobody sets the variable, so a hot path compares it instead of parsing it
    again; ``(os.environ, name)`` where the environment is not CPython's ``os._Environ`` (a new
    string each read: such a comparison then always asks again). For code that runs where every
    Python function it called would be compiled by dynamo as a frame."""
    data = getattr(os.environ, "_data", None)
    return (os.environ, name) if data is None else (data, os.environ.encodekey(name))


def setting(name: str):
    """The parsed value of environment variable ``name`` (its default when unset or empty)."""
    return _value(name, _raw(name))


def settings(names: Tuple[str, ...]) -> tuple:
    """The parsed values of the settings ``names`` (a tuple), each as :func:`setting` reads
    it: while none of their texts changed, one comparison and the values parsed before."""
    data = getattr(os.environ, "_data", None)
    if data is None:
        raw = tuple([_raw(n) for n in names])
    else:  # os.environ's own dict, as _raw reads it, with the tuple's keys encoded once
        keys = _snapshot_keys.get(names)
        if keys is None:
            keys = _snapshot_keys[names] = tuple([os.environ.encodekey(n) for n in names])
        raw = tuple(map(data.get, keys))
    cached = _snapshots.get(names)
    if cached is not None and cached[0] == raw:
        return cached[1]
    values = tuple([_value(n, r) for n, r in zip(names, raw)])
    _snapshots[names] = (raw, values)
    return values


# ----------------------------------------------------------------------------------------
# Run-time switches.

CPU_MODES = ("stock", "reference")
_cpu = {"mode": "stock"}


class _ThreadSwitches(threading.local):
    """The per-thread switches. The class attribute is the value of every thread that has not
    set its own: a thread-local attribute that is missing would make each read raise and
    catch an AttributeError, and the dispatch reads this on every op call."""

    forced = False


_thread = _ThreadSwitches()


def cpu_mode() -> str:
    """What patched layers do with CPU tensors: ``"stock"`` or ``"reference"`` (see enable())."""
    return _cpu["mode"]


def set_cpu_mode(mode: str) -> None:
    if mode not in CPU_MODES:
        raise ValueError(f"cpu must be one of {CPU_MODES}, got {mode!r}")
    _cpu["mode"] = mode


# [the number of force_reference() contexts open in any thread]: see force_contexts()
_force_contexts = [0]
_force_lock = threading.Lock()


@contextlib.contextmanager
def force_reference(enabled: bool = True) -> Iterator[None]:
    """Context manager: while active (in this thread), every op runs its reference path."""
    previous = _thread.forced
    _thread.forced = bool(enabled)
    with _force_lock:
        _force_contexts[0] += 1
    try:
        yield
    finally:
        _thread.forced = previous
        with _force_lock:
            _force_contexts[0] -= 1


def reference_forced() -> bool:
    """Whether :func:`force_reference` is active in this thread."""
    return _thread.forced


def force_contexts() -> list:
    """A one-element list: how many :func:`force_reference` contexts are open, in all threads.
    For a hot path that only needs to know that none is (one list read, where the thread-local
    flag of :func:`reference_forced` costs a per-thread dictionary lookup)."""
    return _force_contexts
