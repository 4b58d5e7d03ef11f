"""enable() / disable(): patch the supported DGL and PyG layer classes in place.

Patching sets one class attribute, ``__call__``, on each supported class (see
:mod:`gnn_fastpath.integrations.shim`); disable() restores each class's own ``__dict__``
exactly as it was (deleting the attribute where the class had none).
"""
from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Dict, Iterable, Iterator, List, Optional, Union

from . import config

FRAMEWORKS = ("dgl", "pyg")
CPU_MODES = config.CPU_MODES
_MISSING = object()
_lock = threading.RLock()
# cls -> the value of cls.__dict__["__call__"] before patching (or _MISSING)
_patched: Dict[type, object] = {}
_state = {"enabled": False, "cpu": "stock", "frameworks": ()}


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


def _shims_for(framework: str) -> List:
    """The framework's shims, or [] when the framework is not installed or importable."""
    module = importlib.import_module(f"gnn_fastpath.integrations.{framework}")
    return module.shims()


def enable(*, frameworks: Optional[Union[str, Iterable[str]]] = None, cpu: Optional[str] = None) -> None:
    """Route the supported layers of the installed frameworks through the fused kernels.

    Args:
        frameworks: ``None`` (all installed), or ``"dgl"`` / ``"pyg"`` or a list of them.
        cpu: ``"stock"`` runs stock code for CPU tensors; ``"reference"`` runs the shims on
            the reference ops for CPU tensors (testing and debugging). ``None`` (default)
            keeps the current mode (``"stock"`` unless an earlier call changed it), so
            enabling another framework later does not reset it.

    Idempotent. The switch is process-wide (it patches classes), not per thread. With the
    environment variable ``GNN_FASTPATH=0`` it does nothing, so a script can be A/B-tested
    without editing it (see :mod:`gnn_fastpath.config`).
    """
    frameworks = _normalise_frameworks(frameworks)
    if cpu is None:
        cpu = _state["cpu"]
    if cpu not in CPU_MODES:
        raise ValueError(f"cpu must be one of {CPU_MODES}, got {cpu!r}")
    if not config.setting("GNN_FASTPATH"):
        return
    from .integrations.shim import make_call

    with _lock:
        config.set_cpu_mode(cpu)
        for framework in frameworks:
            for shim in _shims_for(framework):
                cls = shim.cls
                if cls in _patched:
                    continue
                _patched[cls] = cls.__dict__.get("__call__", _MISSING)
                cls.__call__ = make_call(shim)
        _state.update(enabled=bool(_patched), cpu=cpu,
                      frameworks=tuple(sorted(set(_state["frameworks"]) | set(frameworks))))


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
def enabled(**kwargs) -> Iterator[None]:
    """Context manager: ``enable(**kwargs)`` inside, the previous state restored after."""
    with _lock:
        previous = dict(_state)
    enable(**kwargs)
    try:
        yield
    finally:
        disable()
        if previous["enabled"]:
            enable(frameworks=previous["frameworks"], cpu=previous["cpu"])
