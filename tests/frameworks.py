"""Import helpers for the optional frameworks, used only by tests and examples.

DGL 2.1.0 (PyPI's newest, CPU build) fails to import on torch > 2.2.1 while loading its
GraphBolt data-loading subsystem. gnn_fastpath never needs GraphBolt, so on exactly that
failure we register an empty ``dgl.graphbolt`` module and import again. This lives in the
test/example harness only, never inside the package.
"""
from __future__ import annotations

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
