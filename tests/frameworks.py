"""Import helpers for the optional frameworks, used only by tests and examples.

DGL 2.1.0 (PyPI's newest, CPU build) fails to import on torch > 2.2.1 while loading its
GraphBolt data-loading subsystem. gnn_fastpath never needs GraphBolt, so on exactly that
failure we register an empty ``dgl.graphbolt`` module and import again. This lives in the
test/example harness only, never inside the package.

Likewise PyG's ``NeighborLoader`` needs pyg-lib or torch-sparse to sample, and neither has a
wheel for recent torch: :func:`pyg_neighbor_sampler` installs a pure-torch sampler
(``tests/pyg_sampler_shim.py``) when neither imports.
"""
from __future__ import annotations

import os
import sys
import types


def import_dgl():
    """Return the ``dgl`` module, or None when DGL is not installed or cannot import."""
    try:
        import dgl  # noqa: F401

        return dgl
    except ModuleNotFoundError as exc:
        if exc.name == "dgl":
            return None
        known = "torchdata" in str(exc) or "graphbolt" in str(exc)
    except (ImportError, OSError, FileNotFoundError) as exc:
        known = "graphbolt" in str(exc)
    if not known:
        return None
    for name in [m for m in sys.modules if m == "dgl" or m.startswith("dgl.")]:
        del sys.modules[name]
    sys.modules["dgl.graphbolt"] = types.ModuleType("dgl.graphbolt")
    try:
        import dgl

        return dgl
    except Exception:
        return None


def import_pyg():
    """Return ``torch_geometric`` or None."""
    try:
        import torch_geometric

        return torch_geometric
    except Exception:
        return None


def _sampler_shim():
    """``tests/pyg_sampler_shim.py`` as the module ``pyg_sampler_shim`` (one instance per process,
    whether the tests' folder is on ``sys.path`` or this file was loaded by path)."""
    import importlib.util

    shim = sys.modules.get("pyg_sampler_shim")
    if shim is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyg_sampler_shim.py")
        spec = importlib.util.spec_from_file_location("pyg_sampler_shim", path)
        shim = importlib.util.module_from_spec(spec)
        sys.modules["pyg_sampler_shim"] = shim
        spec.loader.exec_module(shim)
    return shim


#: Folder whose ``sitecustomize.py`` carries the session's PyG adjustments (the sampler shim,
#: torch's scatter instead of a CPU-only torch_scatter) into the processes tests start.
SAMPLER_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sampler_site")


def pyg_neighbor_sampler() -> str | None:
    """What PyG's ``NeighborLoader`` samples with in this process: ``"pyg-lib"``,
    ``"torch-sparse"``, the pure-torch test sampler (``tests/pyg_sampler_shim.py``, installed
    here when neither of the two imports; its name starts with ``"pure-torch"``), or None
    without PyG. Test harness only: the package never changes PyG's sampling."""
    pyg = import_pyg()
    if pyg is None:
        return None
    shim = _sampler_shim()
    real = shim.real_backend()
    if real is not None:
        return real
    return shim.NAME if shim.install() else None


def scatter_without_cpu_only_torch_scatter(pyg, quiet: bool = False) -> bool:
    """PyG routes scatter (e.g. SAGEConv's max) to torch_scatter whenever it imports; a
    CPU-only build (what the device runs get, built from source for NeighborLoader's sampling)
    then fails on CUDA tensors ("Not compiled with CUDA support"). Stock then runs as it would
    without torch_scatter: torch's own scatter_reduce. Used by the test session, the processes
    it starts (``_sampler_site/``) and the benchmarks (benchmarks/harness.py loads this file).
    Returns whether it changed PyG's choice."""
    import torch

    if not (getattr(pyg.typing, "WITH_TORCH_SCATTER", False) and torch.cuda.is_available()):
        return False
    try:
        cuda_version = torch.ops.torch_scatter.cuda_version()
    except Exception:  # noqa: BLE001 - an old build without the op: leave PyG's choice alone
        return False
    if cuda_version != -1:
        return False
    pyg.typing.WITH_TORCH_SCATTER = False
    if not quiet:
        print("torch_scatter is a CPU-only build: PyG's scatter uses torch's scatter_reduce in this run")
    return True


#: The warning torch gives at every synchronising operation under set_sync_debug_mode("warn")
#: (the mode's own "prototype feature" warning, given when it is switched on, is not one).
SYNC_WARNING = "called a synchronizing CUDA operation"


def count_syncs(fn, device=None):
    """Host synchronisations torch reports while ``fn()`` runs (``set_sync_debug_mode("warn")``;
    the package's kernel launches never synchronise); None on a non-CUDA ``device``."""
    import warnings

    import torch

    if device is not None and device.type != "cuda":
        return None
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
