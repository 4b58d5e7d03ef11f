"""enable() / disable(): patch the supported DGL and PyG layer classes in place.

Patching sets one class attribute, ``__call__`` (each shim's ``patched_call()``, see
:mod:`gnn_fastpath.integrations.shim`), on each supported class; disable() restores each
class's own ``__dict__`` exactly as it was (deleting the attribute where the class had none).

Each framework's integration (``gnn_fastpath.integrations.<framework>``) is loaded by name
and registers itself with :mod:`gnn_fastpath.registry`; nothing here imports it. It imports
the framework in its ``shims()`` and raises the import error unchanged; its
``not_installed(exc)`` tells "not installed" (skipped silently unless named) from "installed
but cannot be imported" (warned, or an ImportError when named). A framework whose installed
version is none of its integration's ``TESTED_VERSIONS`` is patched and warned about once per
process. enable() logs what it patched on the ``"gnn_fastpath"`` logger.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from typing import Dict, Iterable, Iterator, List, Tuple, Union

from . import config, registry

FRAMEWORKS = tuple(registry.FRAMEWORKS)
CPU_MODES = config.CPU_MODES
#: What ``enable(frameworks=...)`` takes: None (every installed framework), a name, or names.
Frameworks = Union[None, str, Iterable[str]]
_NAMES = {name: f.title for name, f in registry.FRAMEWORKS.items()}
_MISSING = object()
_lock = threading.RLock()
_log = logging.getLogger("gnn_fastpath")
# cls -> the value of cls.__dict__["__call__"] before patching (or _MISSING)
_patched: Dict[type, object] = {}
_state = {"enabled": False, "cpu": "stock", "frameworks": ()}
# (framework, error text) already warned about: a broken framework warns once per process
_warned: set = set()
# frameworks already warned about for a version their integration was not tested on (once per
# process each)
_version_warned: set = set()


def _normalise_frameworks(frameworks) -> tuple:
    if frameworks is None:
        return FRAMEWORKS
    if isinstance(frameworks, str):
        frameworks = (frameworks,)
    frameworks = tuple(frameworks)
    bad = [f for f in frameworks if f not in FRAMEWORKS]
    if bad or not frameworks:
        raise ValueError(f"frameworks must be None or a subset of {FRAMEWORKS}, got {frameworks!r}")
    return frameworks


def _integration(framework: str) -> registry.Integration:
    return registry.integration(framework)


def _shims_for(framework: str) -> List:
    """The framework's shims. Raises the framework's import error unchanged (ImportError or
    OSError); :func:`_not_installed` says whether it means "not installed"."""
    return _integration(framework).shims()


def _not_installed(framework: str, exc: BaseException) -> bool:
    """Whether ``exc`` (raised by :func:`_shims_for`) means the framework is not installed,
    as opposed to installed but failing to import."""
    return _integration(framework).not_installed(exc)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _import_error(framework: str, exc: BaseException) -> ImportError:
    """The ImportError of ``enable(frameworks=...)`` naming a framework it cannot import."""
    name = _NAMES[framework]
    state = "is not installed" if _not_installed(framework, exc) else "is installed but cannot be imported"
    return ImportError(f"gnn_fastpath.enable(frameworks={framework!r}): {name} {state} "
                       f"({_describe(exc)}). To use it, {_integration(framework).install}.",
                       name=getattr(exc, "name", None))


def _warn_broken(broken: List[Tuple[str, BaseException]], patched: Tuple[str, ...]) -> None:
    """One UserWarning naming every framework that is installed but failed to import (each
    framework and error warned once per process)."""
    new = [(f, exc) for f, exc in broken if (f, _describe(exc)) not in _warned]
    if not new:
        return
    _warned.update((f, _describe(exc)) for f, exc in new)
    parts = [f"{_NAMES[f]} ({f!r}) is installed but cannot be imported ({_describe(exc)}), so its layers "
             f"are not patched; to use it, {_integration(f).install}" for f, exc in new]
    done = f"patched: {', '.join(patched)}" if patched else "nothing was patched"
    warnings.warn(f"gnn_fastpath.enable(): {'; '.join(parts)} ({done})", UserWarning, stacklevel=3)


def _warn_untested_versions(frameworks: Iterable[str]) -> None:
    """One UserWarning per framework (once per process) whose installed version is none of
    those its integration declares (``TESTED_VERSIONS``): its layers are patched all the same,
    but a stock layer whose semantics changed since may no longer match the fused forward."""
    for framework in frameworks:
        entry = _integration(framework)
        with _lock:  # concurrent enable() calls warn once between them
            if framework in _version_warned:
                continue
            installed = entry.untested_version()
            if installed is None:
                continue
            _version_warned.add(framework)
        name, tested = _NAMES[framework], ", ".join(f"{v}.x" for v in entry.tested_versions)
        warnings.warn(f"gnn_fastpath.enable(): {name} {installed} is installed, but the {name} shims reproduce the "
                      f"layers of {name} {tested} (the versions they are tested on, TESTED_VERSIONS of "
                      f"{registry.FRAMEWORKS[framework].module}); its layers are patched anyway. Where a layer "
                      f"changed since, the fused forward may not match stock: compare against "
                      f"gnn_fastpath.disable(), or run stock with GNN_FASTPATH=0", UserWarning, stacklevel=3)


def _log_enabled(frameworks: tuple, patched: Tuple[str, ...], classes: Dict[str, List[str]],
                 broken: List[Tuple[str, BaseException]], cpu: str) -> None:
    """enable()'s one log line: INFO with what it patched, WARNING when it patched nothing."""
    skipped = "".join(f"; skipped {f} (installed but cannot be imported: {_describe(exc)})" for f, exc in broken)
    if patched:
        what = ", ".join(f"{f} ({', '.join(classes[f])})" for f in patched)
        _log.info("gnn_fastpath.enable(): patched %s; CPU tensors run %s%s", what,
                  "stock code" if cpu == "stock" else "the reference ops", skipped)
    else:
        names = " nor ".join(_NAMES[f] for f in frameworks)
        _log.warning("gnn_fastpath.enable(): patched nothing (%s%s could be imported)%s",
                     "neither " if len(frameworks) > 1 else "", names, skipped)


def enable(*, frameworks: Frameworks = None, cpu: str | None = None) -> tuple:
    """Patch the supported DGL and PyG layers to run the fused CUDA kernels.

    The layer classes themselves are patched, so models built before or
    after the call are covered; ``disable()`` restores them exactly:

    * PyG: ``TransformerConv``, ``GATv2Conv``, ``GATConv``, ``GCNConv``,
      ``SAGEConv``, ``AGNNConv``, ``GINConv``, ``GraphConv``, ``EdgeConv``,
      ``DynamicEdgeConv``
    * DGL: ``GATv2Conv``, ``GATConv``, ``GraphConv``, ``SAGEConv``,
      ``AGNNConv``, ``GINConv``, ``EdgeConv``

    A call the fused path does not cover (CPU tensors, float64, hooks, an
    argument it does not take, ...) runs the
    stock forward instead. Every such fallback warns once per (layer,
    reason) with ``gnn_fastpath.FastpathFallbackWarning`` and is counted
    in ``gnn_fastpath.stats()`` (README, "Check it is working", lists
    every reason).

    Args:
        frameworks: ``None`` (default): every installed framework. One
            that is installed but cannot be imported (e.g. PyPI's DGL
            wheel on recent torch) is skipped with a ``UserWarning`` that
            carries its import error (once per process); one that is not
            installed is skipped silently. ``"dgl"``, ``"pyg"`` or a list
            of them: those only; one that cannot be imported raises an
            ``ImportError`` with the original error and what to install,
            before anything is patched. A framework whose installed
            version its shims were not tested on (``TESTED_VERSIONS``
            of its integration) is patched, with a ``UserWarning``
            (once per process).
        cpu: ``"stock"`` runs stock code for CPU tensors; ``"reference"``
            runs the shims on the pure-PyTorch reference ops for them
            (testing and debugging). ``None`` (default) keeps the current
            mode (``"stock"`` unless an earlier call changed it), so
            enabling another framework later does not reset it.

    Returns:
        The frameworks, of those asked for, whose layers are patched when
        it returns, e.g. ``("pyg",)``; ``()`` when none is. It also logs
        one line on the ``"gnn_fastpath"`` logger (INFO; WARNING when
        nothing could be patched).

    Idempotent. Process-wide (it patches classes), not per thread. With
    the environment variable ``GNN_FASTPATH=0`` (or false, off, no) it
    patches nothing, logs one WARNING line and returns ``()``, so a script
    can be A/B-tested without editing it (see :mod:`gnn_fastpath.config`).
    """
    explicit = frameworks is not None
    frameworks = _normalise_frameworks(frameworks)
    if cpu is None:
        cpu = _state["cpu"]
    if cpu not in CPU_MODES:
        raise ValueError(f"cpu must be one of {CPU_MODES}, got {cpu!r}")
    if not config.setting("GNN_FASTPATH"):
        _log.warning("GNN_FASTPATH=0: enable() does nothing")
        return ()

    with _lock:
        loaded: Dict[str, List] = {}
        broken: List[Tuple[str, BaseException]] = []
        for framework in frameworks:
            try:
                loaded[framework] = _shims_for(framework)
            except (ImportError, OSError) as exc:
                if explicit:  # named: an error, raised before anything is patched
                    raise _import_error(framework, exc) from exc
                if not _not_installed(framework, exc):
                    broken.append((framework, exc))
        config.set_cpu_mode(cpu)
        classes: Dict[str, List[str]] = {}
        for framework, shims in loaded.items():
            for shim in shims:
                cls = shim.cls
                if cls not in _patched:
                    _patched[cls] = cls.__dict__.get("__call__", _MISSING)
                    cls.__call__ = shim.patched_call()
                classes.setdefault(framework, []).append(cls.__name__)
        patched = tuple(f for f in FRAMEWORKS if f in classes)
        _state.update(enabled=bool(_patched), cpu=cpu,
                      frameworks=tuple(sorted(set(_state["frameworks"]) | set(patched))))
    _log_enabled(frameworks, patched, classes, broken, cpu)
    _warn_broken(broken, patched)
    _warn_untested_versions(patched)
    return patched


def disable() -> None:
    """Restore every patched class to exactly its original state."""
    with _lock:
        for cls, original in _patched.items():
            if original is _MISSING:
                delattr(cls, "__call__")
            else:
                cls.__call__ = original
        _patched.clear()
        config.set_cpu_mode("stock")
        _state.update(enabled=False, cpu="stock", frameworks=())


def is_enabled() -> bool:
    """True while enable() has patched at least one class."""
    return _state["enabled"]


def patched_classes() -> List[type]:
    """The classes enable() has patched (for inspection and tests)."""
    return list(_patched)


@contextlib.contextmanager
def enabled(**kwargs) -> Iterator[Tuple[str, ...]]:
    """Context manager: ``enable(**kwargs)`` inside (``as`` gives its return value, the
    frameworks patched), the previous state restored after."""
    with _lock:
        previous = dict(_state)
    patched = enable(**kwargs)
    try:
        yield patched
    finally:
        disable()
        if previous["enabled"]:
            enable(frameworks=previous["frameworks"], cpu=previous["cpu"])
