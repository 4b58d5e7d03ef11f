import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/ helpers: zoo, frameworks
# The tuner (on by default) would time variants on a test's first call of a size class and
# keep the choice in ~/.cache: the suite runs the rules, so which kernel a test runs does
# not depend on earlier runs or on timing noise. Tests of the tuner turn it on themselves.
os.environ.setdefault("GNN_FASTPATH_TUNE", "0")
# The small-graph rule would run stock for the aggregation layers on the tests' small graphs:
# the suite tests the fused path at every size. tests/integrations/pyg/test_small_graph.py
# turns the rule on itself.
os.environ.setdefault("GNN_FASTPATH_SMALL_GRAPH", "off")

from frameworks import import_dgl, import_pyg, scatter_without_cpu_only_torch_scatter  # noqa: E402
from frameworks import SAMPLER_SITE, pyg_neighbor_sampler  # noqa: E402

SHARED_DATA = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))


def _cuda_reason():
    import gnn_fastpath

    return gnn_fastpath.cuda.unavailable_reason()


def pytest_configure(config):
    # The device machine's torch_scatter is a CPU-only source build (for NeighborLoader's
    # sampling); stock PyG would send its CUDA scatter there and fail. Stock runs as it
    # would without torch_scatter instead.
    pyg = import_pyg()
    scatter_changed = pyg is not None and scatter_without_cpu_only_torch_scatter(pyg)
    # NeighborLoader without pyg-lib or torch-sparse (neither has a wheel for this torch): the
    # real loader samples with the pure-torch kernel of tests/pyg_sampler_shim.py, here and in
    # the processes the tests start (examples, torchrun, benchmark tools: _sampler_site/, which
    # also carries the torch_scatter choice above into them).
    if (pyg_neighbor_sampler() or "").startswith("pure-torch") or scatter_changed:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SAMPLER_SITE, os.environ.get("PYTHONPATH")) if p)


def pytest_report_header(config):
    return f"PyG NeighborLoader samples with: {pyg_neighbor_sampler() or 'nothing (no PyG)'}"


@pytest.fixture
def no_cpu_only_torch_sparse(monkeypatch):
    """Stock PyG without a CPU-only torch_sparse for CUDA tensors (e.g. EdgeIndex.matmul would
    call it and fail); not session-wide, as NeighborLoader samples with it on the CPU."""
    import torch_geometric.typing as pyg_typing

    if pyg_typing.WITH_TORCH_SPARSE and torch.cuda.is_available():
        try:
            cpu_only = torch.ops.torch_sparse.cuda_version() == -1
        except Exception:  # noqa: BLE001 - no such op in this build: leave PyG's choice
            cpu_only = False
        if cpu_only:
            monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)


def pytest_collection_modifyitems(config, items):
    cuda_reason = _cuda_reason()
    dgl_missing = import_dgl() is None
    for item in items:
        if item.get_closest_marker("cuda") and cuda_reason:
            item.add_marker(pytest.mark.skip(reason=f"needs the CUDA kernels: {cuda_reason}"))
        if item.get_closest_marker("dgl") and dgl_missing:
            item.add_marker(pytest.mark.skip(reason="DGL is not importable here"))


@pytest.fixture(scope="session")
def dgl():
    mod = import_dgl()
    if mod is None:
        pytest.skip("DGL is not importable here")
    return mod


@pytest.fixture(scope="session")
def pyg():
    mod = import_pyg()
    if mod is None:
        pytest.skip("torch_geometric is not installed")
    return mod


@pytest.fixture(scope="session")
def shared_data():
    """Path of ../shared/data (real graphs); skips when this checkout has none beside it."""
    path = os.environ.get("GNN_FASTPATH_DATA", SHARED_DATA)
    if not os.path.isdir(path):
        pytest.skip(f"real graphs not found at {path}")
    return path


@pytest.fixture(autouse=True)
def _release_gpu_cache():
    """Hand cached GPU memory back after a test that holds much of it: the GPU tests run in
    several pytest-xdist workers on one GPU, and one worker's cache must not starve the others."""
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.memory_reserved() > 2**30:
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
