"""What PyG's scale-out path expects of a plugin, on the CPU (reference ops).

- Patched modules stay picklable: ``pickle``, ``copy.deepcopy`` and ``torch.save``/``torch.load``
  of whole models whose convs are patched (what multiprocessing, DataLoader workers,
  ``torch.multiprocessing.spawn`` and checkpointing do), and the copies still run fused with
  the same output.
- ``state_dict`` keys and ``named_parameters()`` (what DDP registers and all-reduces) are the
  same with and without ``enable()``, and neither enabling nor a fused call adds buffers or
  parameters.
- PyG's model classes (``GAT`` with ``v2=True`` and ``v2=False``, ``GraphSAGE``, ``GCN``) run
  fused and match stock in output and every gradient.
- ``DistributedDataParallel`` on a one-process gloo group: ``ddp_model(x, edge_index)`` runs
  fused and its gradients equal the unwrapped stock model's.
"""
from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning

from .conftest import GRAD_FLOOR, RTOL, assert_rel_close

N, F_IN, HIDDEN, OUT, M = 40, 12, 16, 5, 160


@pytest.fixture
def graph():
    """(x [N, F_IN], edge_index) with self loops, duplicates and two destinations without in-edges."""
    from zoo import random_edges

    edge_index, _ = random_edges(N, N, M, seed=3, empty_rows=2)
    gen = torch.Generator().manual_seed(4)
    return torch.randn(N, F_IN, generator=gen), edge_index


class ConvNet(torch.nn.Module):
    """A small model of two patched convs (the classes enable() shims); at module level so
    that pickle finds the class."""

    def __init__(self, kind: str):
        from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, SAGEConv, TransformerConv

        super().__init__()
        if kind == "gatv2":
            self.conv1, self.conv2 = GATv2Conv(F_IN, 4, heads=4), GATv2Conv(16, OUT, heads=1)
        elif kind == "gat":
            self.conv1, self.conv2 = GATConv(F_IN, 4, heads=4), GATConv(16, OUT, heads=1)
        elif kind == "transformer":
            self.conv1, self.conv2 = TransformerConv(F_IN, 4, heads=4), TransformerConv(16, OUT)
        elif kind == "gcn":
            self.conv1, self.conv2 = GCNConv(F_IN, HIDDEN), GCNConv(HIDDEN, OUT)
        else:
            self.conv1, self.conv2 = SAGEConv(F_IN, HIDDEN, aggr="max"), SAGEConv(HIDDEN, OUT)

    def forward(self, x, edge_index):
        return self.conv2(torch.nn.functional.elu(self.conv1(x, edge_index)), edge_index)


def _conv_model(kind: str) -> ConvNet:
    torch.manual_seed(0)
    return ConvNet(kind)


CONV_MODELS = ["gatv2", "gat", "transformer", "gcn", "sage"]


def _fused_calls() -> int:
    return sum(e["fused"]["reference"] + e["fused"]["cuda"] for e in gnn_fastpath.stats().values())


def _fallbacks() -> dict:
    return {k: e["fallback"] for k, e in gnn_fastpath.stats().items() if e["fallback"]}


def _forward(model, x, edge_index):
    """Output and parameter gradients of one forward/backward with a fixed random loss."""
    model.zero_grad(set_to_none=True)
    out = model(x, edge_index)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    (out * weight).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    floor = GRAD_FLOOR * max(g.abs().max().item() for g in expected.values())
    for name, e in expected.items():
        assert_rel_close(actual[name], e, f"grad of {name}", RTOL, floor)


@pytest.fixture
def fused():
    """enable(cpu="reference") for the test, fallbacks raising."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastpathFallbackWarning)
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            yield


# --------------------------------------------------------------------------- (a) pickling
@pytest.mark.parametrize("kind", CONV_MODELS)
@pytest.mark.parametrize("how", ["pickle", "deepcopy", "torch.save"])
def test_patched_models_copy_and_still_run_fused(graph, fused, kind, how):
    x, edge_index = graph
    model = _conv_model(kind)
    out = model(x, edge_index)  # called once before copying: nothing of the call may stick to it
    assert _fused_calls() == 2
    if how == "pickle":
        clone = pickle.loads(pickle.dumps(model))
    elif how == "deepcopy":
        clone = copy.deepcopy(model)
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        clone = torch.load(buffer, weights_only=False)
    assert type(clone.conv1) is type(model.conv1)
    # the class, not the instance, carries the patch: nothing of it is in the pickled state
    assert "__call__" not in vars(clone.conv1) and "__call__" not in vars(model.conv1)
    assert getattr(type(clone.conv1).__call__, "__gnn_fastpath_shim__", None) is not None
    again = clone(x, edge_index)
    assert _fused_calls() == 4, gnn_fastpath.stats()
    assert not _fallbacks()
    assert torch.equal(again, out)


def test_pickled_while_enabled_loads_after_disable(graph):
    """A model pickled while enabled is plain PyG: loaded after disable() it runs stock."""
    x, edge_index = graph
    model = _conv_model("gatv2")
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        fused_out = model(x, edge_index)
        blob = pickle.dumps(model)
    clone = pickle.loads(blob)
    stock_out = clone(x, edge_index)
    assert gnn_fastpath.stats()["pyg.GATv2Conv"]["fused"]["reference"] == 2  # only the enabled calls
    assert_rel_close(fused_out, stock_out, "output")


# --------------------------------------------------------------------------- (b) state_dict
@pytest.mark.parametrize("kind", CONV_MODELS)
def test_state_dict_and_parameters_unchanged_by_enable(graph, kind):
    x, edge_index = graph
    stock = _conv_model(kind)
    names = [n for n, _ in stock.named_parameters()]
    shapes = {k: tuple(v.shape) for k, v in stock.state_dict().items()}
    buffers = [n for n, _ in stock.named_buffers()]
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        built_enabled = _conv_model(kind)
        for model in (stock, built_enabled):
            assert [n for n, _ in model.named_parameters()] == names
            assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == shapes
            assert [n for n, _ in model.named_buffers()] == buffers
            before = {k: v.clone() for k, v in model.state_dict().items()}
            model(x, edge_index)  # a fused call adds nothing and changes nothing
            assert [n for n, _ in model.named_parameters()] == names
            assert [n for n, _ in model.named_buffers()] == buffers
            after = model.state_dict()
            assert after.keys() == before.keys()
            assert all(torch.equal(after[k], before[k]) for k in before)
        # a state_dict moves between stock-built and enabled-built models both ways
        built_enabled.load_state_dict(stock.state_dict())
        stock.load_state_dict(built_enabled.state_dict())
        assert gnn_fastpath.stats()  # the calls above went through the shims
        assert not _fallbacks()
    assert [n for n, _ in stock.named_parameters()] == names


# --------------------------------------------------------------------------- (c) PyG models
def _pyg_model(name: str, **kwargs):
    from torch_geometric.nn import models

    torch.manual_seed(0)
    cls = {"GAT": models.GAT, "GraphSAGE": models.GraphSAGE, "GCN": models.GCN}[name]
    return cls(F_IN, HIDDEN, num_layers=3, out_channels=OUT, **kwargs)


PYG_MODELS = [
    pytest.param("GAT", dict(v2=True, heads=4), "pyg.GATv2Conv", id="GAT-v2"),
    pytest.param("GAT", dict(v2=True, heads=2, jk="cat"), "pyg.GATv2Conv", id="GAT-v2-jk-cat"),
    pytest.param("GAT", dict(heads=4), "pyg.GATConv", id="GAT"),
    pytest.param("GAT", dict(v2=False, heads=2, jk="max", concat=False), "pyg.GATConv", id="GAT-jk-max-mean"),
    pytest.param("GraphSAGE", {}, "pyg.SAGEConv", id="GraphSAGE-mean"),
    pytest.param("GraphSAGE", dict(aggr="max"), "pyg.SAGEConv", id="GraphSAGE-max"),
    pytest.param("GraphSAGE", dict(aggr="sum", jk="max"), "pyg.SAGEConv", id="GraphSAGE-sum-jk-max"),
    pytest.param("GCN", {}, "pyg.GCNConv", id="GCN"),
    pytest.param("GCN", dict(improved=True, jk="last"), "pyg.GCNConv", id="GCN-improved"),
]


@pytest.mark.parametrize("name, kwargs, key", PYG_MODELS)
def test_pyg_model_classes_run_fused(graph, name, kwargs, key):
    x, edge_index = graph
    stock = _pyg_model(name, **kwargs)
    enabled_model = copy.deepcopy(stock)
    expected, expected_grads = _forward(stock, x, edge_index)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastpathFallbackWarning)
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            actual, actual_grads = _forward(enabled_model, x, edge_index)
    counts = gnn_fastpath.stats()
    assert set(counts) == {key}, counts
    assert counts[key] == {"fused": {"cuda": 0, "reference": 3}, "fallback": {}}, counts
    assert_rel_close(actual, expected, "output")
    _assert_grads_close(actual_grads, expected_grads)


def test_gat_v1_builds_gat_conv(graph):
    """GAT(v2=False), PyG's default, is built of GATConv: the class enable() patches."""
    from torch_geometric.nn import GATConv

    model = _pyg_model("GAT", heads=4)
    assert all(type(conv) is GATConv for conv in model.convs)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        assert getattr(vars(GATConv).get("__call__"), "__gnn_fastpath_shim__", None) is not None
    assert "__call__" not in vars(GATConv)


# --------------------------------------------------------------------------- (d) DDP
@pytest.fixture
def process_group(tmp_path):
    """A one-process gloo group (FileStore), destroyed afterwards."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("kind", CONV_MODELS)
def test_ddp_wrapped_model_runs_fused(graph, process_group, kind):
    from torch.nn.parallel import DistributedDataParallel

    x, edge_index = graph
    stock = _conv_model(kind)
    ddp_model = DistributedDataParallel(copy.deepcopy(stock))
    expected, expected_grads = _forward(stock, x, edge_index)
    for step in range(2):  # the second step: DDP's reducer after its first iteration
        with warnings.catch_warnings():
            warnings.simplefilter("error", FastpathFallbackWarning)
            with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
                actual, actual_grads = _forward(ddp_model, x, edge_index)
        assert _fused_calls() == 2 * (step + 1), gnn_fastpath.stats()
        assert not _fallbacks()
        assert_rel_close(actual, expected, "output")
        # DDP names parameters "module.<name>"
        _assert_grads_close({k.removeprefix("module."): v for k, v in actual_grads.items()}, expected_grads)
