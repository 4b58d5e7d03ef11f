"""The test suite's pure-torch neighbour sampler (tests/pyg_sampler_shim.py) under PyG's real
``NeighborLoader``: what a mini-batch must be, whichever kernel samples it.

Every test here runs the shim, also where torch-sparse or pyg-lib imports (the ``shim``
fixture points PyG at it for the test); where torch-sparse imports, the shim's batches are
compared with torch-sparse's: the same batches exactly (nodes, edge ids, edges, in order)
where every fan-out covers the whole neighbourhood, the same per-hop sizes on average where
it samples. The session uses the shim only when neither real backend imports (conftest.py).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import pyg_sampler_shim as shim
from frameworks import SAMPLER_SITE, pyg_neighbor_sampler

pytest.importorskip("torch_geometric")

from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import NeighborLoader  # noqa: E402

HAS_TORCH_SPARSE = importlib.util.find_spec("torch_sparse") is not None


def _graph(nodes=300, edges=2400, seed=0):
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, nodes, (2, edges), generator=gen)
    return Data(x=torch.arange(nodes, dtype=torch.float)[:, None], edge_index=edge_index, num_nodes=nodes)


def _in_degree(data):
    return torch.bincount(data.edge_index[1], minlength=data.num_nodes)


@pytest.fixture
def shim_sampler(monkeypatch):
    """PyG's NeighborSampler samples with the shim for this test."""
    import torch_geometric.typing as pyg_typing

    if not shim.register_op():
        pytest.skip("pyg-lib defines pyg::neighbor_sample here")
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)
    for flag in ("WITH_PYG_LIB", "WITH_EDGE_TIME_NEIGHBOR_SAMPLE", "WITH_WEIGHTED_NEIGHBOR_SAMPLE"):
        monkeypatch.setattr(pyg_typing, flag, getattr(pyg_typing, flag))  # restored afterwards
    shim.use_shim(pyg_typing)


def _batches(data, fanouts, seeds, batch_size, seed=0, **kwargs):
    torch.manual_seed(seed)
    return list(NeighborLoader(data, num_neighbors=fanouts, input_nodes=seeds, batch_size=batch_size, **kwargs))


def _hop_of_nodes(batch):
    """Hop at which each node of the batch joined (0: seeds)."""
    counts = torch.tensor(batch.num_sampled_nodes)
    return torch.repeat_interleave(torch.arange(counts.numel()), counts)


# --------------------------------------------------------------------------- what a batch is
@pytest.mark.parametrize("fanouts", [[5, 3], [2, 2, 2], [-1, 4], [0, 3]])
def test_batches_are_real_subgraphs(shim_sampler, fanouts):
    data = _graph()
    deg = _in_degree(data)
    seeds = torch.randperm(data.num_nodes, generator=torch.Generator().manual_seed(1))[:70]
    batches = _batches(data, fanouts, seeds, batch_size=32)
    assert [b.batch_size for b in batches] == [32, 32, 6]
    for i, batch in enumerate(batches):
        n_id, e_id, ei = batch.n_id, batch.e_id, batch.edge_index
        # the first batch_size nodes are the seeds, in order; every node once
        assert torch.equal(n_id[:batch.batch_size], seeds[32 * i: 32 * i + batch.batch_size])
        assert n_id.unique().numel() == n_id.numel()
        assert torch.equal(batch.x[:, 0].long(), n_id)
        # every edge is a graph edge: e_id names it, and its ends are the nodes n_id names
        assert torch.equal(torch.stack([n_id[ei[0]], n_id[ei[1]]]), data.edge_index[:, e_id])
        assert e_id.unique().numel() == e_id.numel()  # without replacement: no edge twice
        # per-hop sizes: nodes [seeds, hop 1, ...], edges [hop 1, ...], in that order
        assert len(batch.num_sampled_nodes) == len(fanouts) + 1 and len(batch.num_sampled_edges) == len(fanouts)
        assert batch.num_sampled_nodes[0] == batch.batch_size
        assert sum(batch.num_sampled_nodes) == n_id.numel() and sum(batch.num_sampled_edges) == ei.size(1)
        hop = _hop_of_nodes(batch)
        edge_hop = torch.repeat_interleave(torch.arange(len(fanouts)), torch.tensor(batch.num_sampled_edges))
        assert torch.equal(hop[ei[1]], edge_hop)            # hop l expands the nodes hop l - 1 added
        assert bool((hop[ei[0]] <= edge_hop + 1).all())     # ... to nodes seen before or added now
        # each expanded node has min(fan-out, in-degree) sampled in-edges (all of them for -1)
        got = torch.bincount(ei[1], minlength=n_id.numel())
        for h, k in enumerate(fanouts):
            nodes = (hop == h).nonzero().flatten()
            want = deg[n_id[nodes]] if k < 0 else torch.clamp(deg[n_id[nodes]], max=k)
            assert torch.equal(got[nodes], want), (h, k)
        assert int(got[hop == len(fanouts)].sum()) == 0     # the last hop's nodes are not expanded


def test_edge_attributes_follow_e_id(shim_sampler):
    """e_id are the caller's edge ids (PyG maps the CSC positions back through its permutation)."""
    data = _graph()
    data.edge_attr = torch.arange(data.num_edges, dtype=torch.float)[:, None] * 10
    for batch in _batches(data, [4, 4], torch.arange(40), batch_size=20):
        assert torch.equal(batch.edge_attr[:, 0], batch.e_id.float() * 10)


def test_uniform_without_replacement(shim_sampler):
    """300 seeds with 10 in-edges each from sources of their own, fan-out 3, 10 draws: each
    edge is drawn with probability 3/10, three distinct edges every time."""
    stars, draws = 300, 10
    dst = torch.arange(stars).repeat_interleave(10)
    data = Data(edge_index=torch.stack([stars + torch.arange(10 * stars), dst]), num_nodes=11 * stars)
    hits = torch.zeros(10)
    for seed in range(draws):
        [batch] = _batches(data, [3], torch.arange(stars), batch_size=stars, seed=seed)
        assert batch.e_id.numel() == 3 * stars and batch.e_id.unique().numel() == 3 * stars
        assert torch.equal(torch.bincount(data.edge_index[1, batch.e_id], minlength=stars), torch.full((stars,), 3))
        hits += torch.bincount(batch.e_id % 10, minlength=10)     # which of its 10 edges each seed drew
    n, p = stars * draws, 0.3
    sd = (n * p * (1 - p)) ** 0.5
    assert float((hits - n * p).abs().max()) < 4.5 * sd, hits
    assert float(((hits - n * p) ** 2 / (n * p)).sum()) < 27.9, hits  # chi-square, 9 dof, p = 0.001


def test_with_replacement(shim_sampler):
    data = _graph(nodes=50, edges=400)
    deg = _in_degree(data)
    for batch in _batches(data, [6], torch.arange(50), batch_size=25, replace=True):
        got = torch.bincount(batch.edge_index[1], minlength=batch.n_id.numel())[:batch.batch_size]
        assert torch.equal(got, torch.where(deg[batch.n_id[:25]] > 0, 6, 0))
        assert torch.equal(batch.n_id[batch.edge_index[0]], data.edge_index[0, batch.e_id])


def test_follows_torch_manual_seed(shim_sampler):
    data = _graph()
    a, b, c = (_batches(data, [3, 2], torch.arange(64), 64, seed=s)[0] for s in (0, 0, 1))
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.e_id, b.e_id)
    assert not torch.equal(a.e_id, c.e_id)


def test_op_through_the_dispatcher(shim_sampler):
    """pyg-lib's schema: called positionally as PyG does, and by keyword; int32 stays int32."""
    rowptr = torch.tensor([0, 2, 3, 3, 5])           # CSC: in-edges of 0: {1, 2}, of 1: {3}, of 3: {0, 1}
    col = torch.tensor([1, 2, 3, 0, 1])
    row, col_out, node, edge, nn, ne = torch.ops.pyg.neighbor_sample(
        rowptr, col, torch.tensor([0]), [-1, -1], None, None, None, None, True, False, True, False, "uniform", True)
    assert node.tolist() == [0, 1, 2, 3] and nn == [1, 2, 1] and ne == [2, 1]
    assert row.tolist() == [1, 2, 3] and col_out.tolist() == [0, 0, 1] and edge.tolist() == [0, 1, 2]
    out = torch.ops.pyg.neighbor_sample(rowptr.int(), col.int(), torch.tensor([3], dtype=torch.int32), [1],
                                        csc=True, return_edge_id=False)
    assert out[2].dtype == torch.int32 and out[3] is None and out[4] == [1, 1] and out[5] == [1]
    with pytest.raises(NotImplementedError, match="disjoint=True"):
        torch.ops.pyg.neighbor_sample(rowptr, col, torch.tensor([0]), [1], disjoint=True)


# --------------------------------------------------------------------------- against torch-sparse
@pytest.mark.skipif(not HAS_TORCH_SPARSE, reason="torch-sparse is not installed here")
def test_full_neighbourhoods_match_torch_sparse(monkeypatch):
    """Fan-outs at least the largest in-degree: no randomness, and the shim's batches are
    torch-sparse's exactly (same nodes, edge ids and edges, in the same order)."""
    import torch_geometric.typing as pyg_typing

    if not pyg_typing.WITH_TORCH_SPARSE:
        pytest.skip("torch-sparse does not import into PyG here")
    data = _graph()
    k = int(_in_degree(data).max())
    seeds = torch.arange(0, 300, 7)
    monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", False)
    real = _batches(data, [k, k, k], seeds, batch_size=16)
    if not shim.register_op():
        pytest.skip("pyg-lib defines pyg::neighbor_sample here")
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)
    shim.use_shim(pyg_typing)
    ours = _batches(data, [k, k, k], seeds, batch_size=16)
    assert len(real) == len(ours) == 3
    for a, b in zip(real, ours):
        assert a.batch_size == b.batch_size
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.e_id, b.e_id)
        assert torch.equal(a.edge_index, b.edge_index)
        # torch-sparse gives no per-hop sizes; ours are those of a breadth-first search
        frontier, seen, nodes, edges = set(b.n_id[:b.batch_size].tolist()), set(b.n_id[:b.batch_size].tolist()), [], []
        for _ in range(3):
            src = [(int(s), int(d)) for s, d in data.edge_index.t() if int(d) in frontier]
            new = {s for s, _ in src} - seen
            seen |= new
            nodes.append(len(new))
            edges.append(len(src))
            frontier = new
        assert b.num_sampled_nodes == [b.batch_size, *nodes] and b.num_sampled_edges == edges


@pytest.mark.skipif(not HAS_TORCH_SPARSE, reason="torch-sparse is not installed here")
def test_sampled_sizes_match_torch_sparse_on_average(monkeypatch):
    """Fan-outs below the degrees: the batch sizes are random; their means over many batches
    agree with torch-sparse's, and the first hop's edge count is exact."""
    import torch_geometric.typing as pyg_typing

    if not pyg_typing.WITH_TORCH_SPARSE:
        pytest.skip("torch-sparse does not import into PyG here")
    data = _graph(nodes=400, edges=4000)
    deg = _in_degree(data)
    seeds = torch.arange(400)
    fanouts = [4, 3]

    def sizes(draw):
        out = []
        for b in _batches(data, fanouts, seeds, batch_size=40, seed=draw, shuffle=True):
            hop1 = int((b.edge_index[1] < b.batch_size).sum())
            assert hop1 == int(torch.clamp(deg[b.n_id[:b.batch_size]], max=4).sum())
            out.append([b.n_id.numel(), b.edge_index.size(1)])
        return torch.tensor(out, dtype=torch.float64)

    monkeypatch.setattr(pyg_typing, "WITH_PYG_LIB", False)
    real = torch.cat([sizes(draw) for draw in range(4)])
    if not shim.register_op():
        pytest.skip("pyg-lib defines pyg::neighbor_sample here")
    monkeypatch.setattr(pyg_typing, "WITH_TORCH_SPARSE", False)
    shim.use_shim(pyg_typing)
    ours = torch.cat([sizes(draw) for draw in range(10, 14)])
    se = (real.var(0) / len(real) + ours.var(0) / len(ours)).sqrt()
    assert bool(((real.mean(0) - ours.mean(0)).abs() < 5 * se + 1e-9).all()), (real.mean(0), ours.mean(0), se)


# --------------------------------------------------------------------------- the session and subprocesses
def test_session_sampler():
    """The session samples with a real backend where one imports, else with the shim, and says so."""
    import torch_geometric.typing as pyg_typing

    name = pyg_neighbor_sampler()
    real = (importlib.util.find_spec("pyg_lib") or importlib.util.find_spec("torch_sparse")) is not None
    assert name.startswith("pure-torch") is (not real), name
    assert shim.installed() is (not real)
    assert pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE
    if not real:
        assert SAMPLER_SITE in os.environ.get("PYTHONPATH", "").split(os.pathsep)


SUBPROCESS = """
import sys
for name in sys.argv[1:]:
    sys.modules[name] = None        # as if not installed
import torch
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader
import torch_geometric.typing as T
data = Data(edge_index=torch.tensor([[1, 2, 3, 0], [0, 0, 1, 3]]), num_nodes=4)
batch = next(iter(NeighborLoader(data, num_neighbors=[-1, -1], input_nodes=torch.tensor([0]), batch_size=1)))
print(T.WITH_PYG_LIB, T.WITH_TORCH_SPARSE, batch.n_id.tolist(), getattr(batch, "num_sampled_nodes", None))
"""


def test_subprocesses_get_the_shim_without_a_real_backend(tmp_path):
    """_sampler_site/sitecustomize.py: a Python process started with it on PYTHONPATH samples
    with the shim when pyg-lib and torch-sparse are missing (hidden here), and leaves a real
    backend alone; GNN_FASTPATH_TEST_SAMPLER_SHIM=0 turns it off."""
    script = tmp_path / "sample.py"
    script.write_text(SUBPROCESS)

    def run(*hide, **env):
        env = dict(os.environ, PYTHONPATH=SAMPLER_SITE, **env)
        return subprocess.run([sys.executable, str(script), *hide], capture_output=True, text=True, env=env,
                              timeout=120)

    proc = run("pyg_lib", "torch_sparse", "torch_scatter")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "True False [0, 1, 2, 3] [1, 2, 1]", proc.stdout
    proc = run("pyg_lib", "torch_sparse", "torch_scatter", GNN_FASTPATH_TEST_SAMPLER_SHIM="0")
    assert proc.returncode != 0 and "requires either 'pyg-lib' or 'torch-sparse'" in proc.stderr, proc.stderr
    if HAS_TORCH_SPARSE:
        proc = run("pyg_lib")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[-1].startswith("False True [0, "), proc.stdout
