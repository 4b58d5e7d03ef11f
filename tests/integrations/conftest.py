"""Fixtures shared by the PyG and DGL integration tests."""
from __future__ import annotations

import os

import pytest

import gnn_fastpath


@pytest.fixture(scope="session")
def cora(shared_data, tmp_path_factory, pyg):
    """Cora (Planetoid split) read offline from the shared raw files."""
    raw = os.path.join(shared_data, "planetoid")
    names = [n for n in os.listdir(raw) if n.startswith("ind.cora.")] if os.path.isdir(raw) else []
    if len(names) < 8:
        pytest.skip(f"Cora raw files not found in {raw}")
    root = tmp_path_factory.mktemp("planetoid")
    os.makedirs(root / "Cora" / "raw")
    for name in names:
        os.symlink(os.path.join(raw, name), root / "Cora" / "raw" / name)
    from torch_geometric.datasets import Planetoid

    return Planetoid(str(root), "Cora")[0]


@pytest.fixture
def clean_fastpath():
    """Layers unpatched and stats cleared before and after the test."""
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()
    yield
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()
