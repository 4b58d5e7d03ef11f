"""PadToCapacity: fixed-size NeighborLoader batches that leave every real node's result alone.

- Padding changes no real node's output and no gradient of a loss over the seeds, for the
  patched layers, stock and through the shims (``cpu="reference"``).
- Grown capacities cover every batch, hold once they do, and only grow; given capacities
  are kept, and a batch that does not fit them is a ValueError naming the argument.
- Node- and edge-level entries are padded (zeros, False), graph-level ones are kept; the
  padding edges are self loops among the padding nodes, ascending and spread; an
  ``EdgeIndex`` stays one, with its sort order.
- A compiled model over padded batches of several real sizes compiles once (CPU,
  ``aot_eager``); on the GPU, CUDA graphs (``mode="reduce-overhead"``) with ``enable()``
  replay every padded batch with the seeds' outputs and gradients of eager stock on the
  unpadded batch.
"""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import gnn_fastpath

from .conftest import GRAD_FLOOR, assert_rel_close

N_NODES, N_EDGES, F_IN, HID, CLASSES = 400, 2400, 6, 8, 3
FANOUTS, BATCH = [4, 3], 16


@pytest.fixture(scope="module")
def graph(pyg):
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, N_NODES, (2, N_EDGES), generator=gen)
    return Data(x=torch.randn(N_NODES, F_IN, generator=gen), edge_index=edge_index,
                y=torch.randint(0, CLASSES, (N_NODES,), generator=gen),
                edge_attr=torch.randn(N_EDGES, 2, generator=gen),
                train_mask=torch.rand(N_NODES, generator=gen) < 0.5)


def _loader(graph, **kwargs):
    from torch_geometric.loader import NeighborLoader

    return NeighborLoader(graph, num_neighbors=FANOUTS, batch_size=BATCH, shuffle=False, **kwargs)


@pytest.fixture(scope="module")
def batches(graph):
    """Unpadded NeighborLoader batches of several sizes."""
    return [b for b, _ in zip(_loader(graph), range(6))]


def _pad(**kwargs):
    from gnn_fastpath.integrations.pyg import PadToCapacity

    return PadToCapacity(**kwargs)


LAYERS = {
    "GCNConv": lambda g: g.GCNConv(HID, HID),
    "GATConv": lambda g: g.GATConv(HID, HID // 2, heads=2),
    "GATv2Conv": lambda g: g.GATv2Conv(HID, HID // 2, heads=2),
    "TransformerConv": lambda g: g.TransformerConv(HID, HID // 2, heads=2),
    "SAGEConv-max": lambda g: g.SAGEConv(HID, HID, aggr="max"),
    "GINConv": lambda g: g.GINConv(torch.nn.Linear(HID, HID)),
    "GraphConv": lambda g: g.GraphConv(HID, HID),
    "AGNNConv": lambda g: g.AGNNConv(),
}


class Net(torch.nn.Module):
    """A projection, two ``name`` layers with ReLU, a classifier."""

    def __init__(self, name: str):
        super().__init__()
        import torch_geometric.nn as g

        self.lin = torch.nn.Linear(F_IN, HID)
        self.convs = torch.nn.ModuleList([LAYERS[name](g), LAYERS[name](g)])
        self.head = torch.nn.Linear(HID, CLASSES)

    def forward(self, x, edge_index):
        x = self.lin(x)
        for conv in self.convs:
            x = torch.relu(conv(x, edge_index))
        return self.head(x)


def _step(model, batch):
    """(outputs of the real nodes, parameter gradients) of a cross-entropy over the seeds."""
    model.zero_grad(set_to_none=True)
    out = model(batch.x, batch.edge_index)
    torch.nn.functional.cross_entropy(out[:batch.batch_size], batch.y[:batch.batch_size]).backward()
    return out, {k.removeprefix("_orig_mod."): p.grad.clone() for k, p in model.named_parameters()
                 if p.grad is not None}


def _assert_same_step(actual, expected, n: int, rtol: float = 1e-5):
    (out_a, grads_a), (out_e, grads_e) = actual, expected
    assert_rel_close(out_a[:n], out_e[:n], "real nodes' outputs", rtol)
    assert grads_a.keys() == grads_e.keys()
    floor = max(g.abs().max().item() for g in grads_e.values()) * GRAD_FLOOR
    for k in grads_e:
        assert_rel_close(grads_a[k], grads_e[k], f"grad {k}", rtol, floor)


# ------------------------------------------------------------------------------ equivalence
@pytest.mark.parametrize("fastpath", [False, True], ids=["stock", "enabled"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_padding_changes_no_real_output_and_no_gradient(batches, name, fastpath):
    torch.manual_seed(0)
    model = Net(name)
    pad = _pad(multiple=64)
    with contextlib.ExitStack() as stack:
        if fastpath:
            stack.enter_context(gnn_fastpath.enabled(frameworks="pyg", cpu="reference"))
        for batch in batches[:3]:
            n = batch.num_nodes
            padded = pad(copy.copy(batch))
            assert padded.num_nodes > n and padded.edge_index.size(1) > batch.edge_index.size(1)
            _assert_same_step(_step(model, padded), _step(model, batch), n)
        fused = sum(c["fused"]["reference"] for c in gnn_fastpath.stats().values())
    assert fused == (12 if fastpath else 0)


# ------------------------------------------------------------------------------ capacities
def test_grown_capacities_cover_every_batch_then_hold(graph):
    pad = _pad(slack=0.1, multiple=32)
    shapes, needs = [], []
    for batch in _loader(graph, transform=pad):
        shapes.append((batch.num_nodes, batch.edge_index.size(1)))
        needs.append((sum(batch.num_sampled_nodes), sum(batch.num_sampled_edges)))
    assert len(shapes) > 10
    # Every batch fits, with a padding node to spare; capacities never shrink.
    for (n_cap, m_cap), (n, m) in zip(shapes, needs):
        assert n_cap > n and m_cap >= m and n_cap % 32 == 0 and m_cap % 32 == 0
    assert all(b[0] >= a[0] and b[1] >= a[1] for a, b in zip(shapes, shapes[1:]))
    changes = sum(a != b for a, b in zip(shapes, shapes[1:]))
    assert changes == pad.growths and pad.growths <= 3, (shapes, pad.growths)
    assert (pad.node_capacity, pad.edge_capacity) == shapes[-1]


def test_given_capacities_are_kept_and_checked(batches):
    n = max(b.num_nodes for b in batches)
    m = max(b.edge_index.size(1) for b in batches)
    pad = _pad(num_nodes=n + 5, num_edges=m + 7)
    for batch in batches:
        out = pad(copy.copy(batch))
        assert (out.num_nodes, out.edge_index.size(1)) == (n + 5, m + 7)
    assert pad.growths == 0
    for given in (dict(num_nodes=n + 5), dict(num_edges=m + 7)):  # the other capacity grown
        one = _pad(**given)
        one(copy.copy(batches[0]))
        assert one.growths == 0
    small = min(batches, key=lambda b: b.num_nodes)
    with pytest.raises(ValueError, match="num_nodes=5"):
        _pad(num_nodes=5)(copy.copy(small))
    with pytest.raises(ValueError, match="num_edges=3"):
        _pad(num_edges=3)(copy.copy(small))
    # no spare node for the padding edges
    with pytest.raises(ValueError, match="padding node"):
        _pad(num_nodes=small.num_nodes, num_edges=small.edge_index.size(1) + 1)(copy.copy(small))
    # exactly full: nothing to pad, nothing needed
    full = _pad(num_nodes=small.num_nodes, num_edges=small.edge_index.size(1))(copy.copy(small))
    assert torch.equal(full.edge_index, small.edge_index)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_nodes=0), "num_nodes"), (dict(num_edges=2.5), "num_edges"), (dict(num_nodes=True), "num_nodes"),
    (dict(slack=-0.1), "slack"), (dict(slack=float("nan")), "slack"), (dict(multiple=0), "multiple"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _pad(**kwargs)


def test_bad_batches_are_refused_clearly(pyg, batches):
    from torch_geometric.data import Data, HeteroData

    hetero = HeteroData()
    hetero["a"].x = torch.randn(3, 2)
    with pytest.raises(TypeError, match="HeteroData"):
        _pad()(hetero)
    with pytest.raises(ValueError, match="edge_index"):
        _pad()(Data(x=torch.randn(3, 2)))


# ------------------------------------------------------------------------------ what is padded
def test_entries_padded_by_level(batches):
    batch = batches[0]
    n, m = batch.num_nodes, batch.edge_index.size(1)
    out = _pad(multiple=64, add_pad_mask=True)(copy.copy(batch))
    n_cap, m_cap = out.num_nodes, out.edge_index.size(1)
    for key in ("x", "y", "n_id", "train_mask"):
        assert out[key].size(0) == n_cap and torch.equal(out[key][:n], batch[key]), key
        assert not out[key][n:].any(), key
    assert out.train_mask.dtype == torch.bool
    for key in ("edge_attr", "e_id"):
        assert out[key].size(0) == m_cap and torch.equal(out[key][:m], batch[key]), key
        assert not out[key][m:].any(), key
    assert out.batch_size == batch.batch_size
    assert torch.equal(out.input_id, batch.input_id)
    assert out.num_sampled_nodes == batch.num_sampled_nodes
    assert torch.equal(out.pad_node_mask, torch.arange(n_cap) < n)
    assert torch.equal(out.pad_edge_mask, torch.arange(m_cap) < m)
    # the padding edges: self loops on padding nodes, ascending, spread evenly
    ei = out.edge_index
    assert ei.dtype == batch.edge_index.dtype and torch.equal(ei[:, :m], batch.edge_index)
    pad_src, pad_dst = ei[:, m:]
    assert torch.equal(pad_src, pad_dst) and bool((pad_dst >= n).all()) and bool((pad_dst < n_cap).all())
    assert bool((pad_dst[1:] >= pad_dst[:-1]).all())
    per_node = torch.bincount(pad_dst - n, minlength=n_cap - n)
    k, p = m_cap - m, n_cap - n
    assert int(per_node.max()) <= -(-k // p) and int(per_node.min()) >= k // p


def test_edge_index_subclass_keeps_its_sort_order(pyg, batches):
    from torch_geometric import EdgeIndex

    batch = copy.copy(batches[1])
    n = batch.num_nodes
    order = torch.argsort(batch.edge_index[1], stable=True)
    batch.edge_index = EdgeIndex(batch.edge_index[:, order], sparse_size=(n, n), sort_order="col")
    out = _pad(multiple=64)(batch)
    assert isinstance(out.edge_index, EdgeIndex)
    assert out.edge_index.sparse_size() == (out.num_nodes, out.num_nodes)
    assert out.edge_index.sort_order == "col"
    out.edge_index.validate()  # raises if the claimed order or sizes do not hold
    bipartite = copy.copy(batches[1])
    bipartite.edge_index = EdgeIndex(bipartite.edge_index, sparse_size=(n, n + 1))
    with pytest.raises(ValueError, match="bipartite"):
        _pad()(bipartite)


# ------------------------------------------------------------------------------ compiled
@pytest.mark.parametrize("name", ["GATv2Conv", "SAGEConv-max"])
def test_compiled_model_compiles_once_over_padded_batches(batches, name):
    """Padded batches of several real sizes: one compiled graph (``dynamic=False``: a new
    shape would compile again), each step's outputs those of the eager model."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = Net(name)
    pad = _pad(num_nodes=max(b.num_nodes for b in batches) + 1,
               num_edges=max(b.edge_index.size(1) for b in batches))
    counters.clear()
    graphs = []
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        compiled = torch.compile(copy.deepcopy(model), backend="aot_eager", dynamic=False)
        for batch in batches[:4]:
            padded = pad(copy.copy(batch))
            _assert_same_step(_step(compiled, padded), _step(model, padded), batch.num_nodes)
            graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs[-1] == graphs[0], f"compiled again for new batches: {graphs}"


CUDA_CASES = ["GATv2Conv", "GATConv", "TransformerConv", "GCNConv", "SAGEConv-max"]


@pytest.mark.cuda
@pytest.mark.parametrize("name", CUDA_CASES)
def test_cuda_graphs_on_padded_batches_match_eager_stock(graph, name, no_cpu_only_torch_sparse):
    """``mode="reduce-overhead"`` with ``enable()`` on padded NeighborLoader batches: every
    step's real outputs and gradients are eager stock's on the unpadded batch; no recompile
    after the capacities settle, no CUDA graph skipped, the fused path traced."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = Net(name).cuda()
    stock = copy.deepcopy(model)
    batches = [b.to("cuda") for b, _ in zip(_loader(graph), range(6))]
    pad = _pad(num_nodes=max(b.num_nodes for b in batches) + 1, num_edges=max(b.edge_index.size(1) for b in batches))
    expected = [_step(stock, batch) for batch in batches]  # eager stock, unpadded
    counters.clear()
    graphs = []
    with gnn_fastpath.enabled(frameworks="pyg"):
        compiled = torch.compile(model, mode="reduce-overhead")
        for batch, want in zip(batches, expected):
            _assert_same_step(_step(compiled, pad(copy.copy(batch))), want, batch.num_nodes, rtol=1e-4)
            graphs.append(counters["stats"]["unique_graphs"])
        traced = {k: c["compiled"] for k, c in gnn_fastpath.stats().items() if c.get("compiled")}
    assert graphs[-1] == graphs[0], f"recompiled: unique graphs after each step {graphs}"
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert traced and all(set(c) == {"cuda"} for c in traced.values()), traced


def test_a_batch_without_node_tensors_gets_the_node_capacity(pyg):
    """Without node-level tensors the node count is stored, not inferred: it becomes the capacity."""
    from torch_geometric.data import Data

    out = _pad(multiple=8)(Data(edge_index=torch.tensor([[0, 1, 2], [1, 2, 3]]), num_nodes=5))
    assert out.num_nodes == 8 and out.edge_index.size(1) == 8
    assert int(out.edge_index.max()) < 8
