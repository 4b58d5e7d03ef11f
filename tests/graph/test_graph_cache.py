"""Graph.of caching for tensors and sparse adjacencies: hits, staleness, weak refs, bound;
the generic cache underneath it, and the adapter registry.

DGL graphs are covered in test_graph_dgl.py.
"""
import gc
import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from gnn_fastpath.graph import Graph, cache_size, cached_count, clear_cache, register_adapter, set_cache_size
from gnn_fastpath.graph import graph as graph_module
from gnn_fastpath.graph.cache import cached
from zoo import random_edges


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Every test starts with an empty cache and leaves the size as it found it."""
    size = cache_size()
    clear_cache()
    yield
    set_cache_size(size)
    clear_cache()


def _same_csr(a: Graph, b: Graph) -> bool:
    return (torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
            and torch.equal(a.perm, b.perm) and (a.n_src, a.n_dst) == (b.n_src, b.n_dst))


def test_hit_returns_same_object():
    ei, _ = random_edges(20, 20, 60, seed=1)
    g = Graph.of(ei)
    assert Graph.of(ei) is g
    assert Graph.of(ei, None) is g
    assert cached_count() == 1 and cached_count("cpu") == 1
    assert _same_csr(g, Graph.from_edge_index(ei))


def test_graph_of_graph_is_identity():
    g = Graph.from_edge_index(torch.tensor([[0], [1]]))
    assert Graph.of(g) is g
    assert cached_count() == 0


def test_equal_but_distinct_tensors_are_distinct_entries():
    ei, _ = random_edges(20, 20, 60, seed=1)
    other = ei.clone()
    assert Graph.of(ei) is not Graph.of(other)
    assert cached_count() == 2


def test_rebuild_after_setitem():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    g = Graph.of(ei)
    ei[1, 0] = 2  # 0 -> 2 now
    g2 = Graph.of(ei)
    assert g2 is not g
    assert _same_csr(g2, Graph.from_edge_index(torch.tensor([[0, 1, 2], [2, 2, 0]])))
    assert g2.in_degree().tolist() == [1, 0, 2]
    assert Graph.of(ei) is g2
    assert cached_count() == 1  # the stale entry was replaced, not added to


def test_rebuild_after_copy_():
    ei, _ = random_edges(15, 15, 40, seed=2)
    g = Graph.of(ei)
    new, _ = random_edges(15, 15, 40, seed=3)
    new = new[:, : ei.size(1)]
    ei.copy_(new)
    g2 = Graph.of(ei)
    assert g2 is not g
    assert _same_csr(g2, Graph.from_edge_index(new))


def test_rebuild_after_in_place_op_on_view():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    g = Graph.of(ei)
    ei[0].add_(1)  # sources 1, 2, 3 (a write through a view bumps the shared version)
    g2 = Graph.of(ei)
    assert g2 is not g
    assert g2.indices.tolist() == [3, 1, 2] and g2.n_src == 4


def test_different_num_nodes_gives_different_graph():
    ei = torch.tensor([[0, 1], [1, 0]])
    a = Graph.of(ei)
    b = Graph.of(ei, 5)
    c = Graph.of(ei, (3, 4))
    d = Graph.of(ei, [3, 4])  # same pair as a list
    assert (a.n_src, a.n_dst) == (2, 2)
    assert (b.n_src, b.n_dst) == (5, 5) and b is not a
    assert (c.n_src, c.n_dst) == (3, 4) and c is not b
    assert d is c
    assert Graph.of(ei, torch.tensor(5)) is not c  # int from a tensor, rebuilt for 5
    assert Graph.of(ei, 5) is Graph.of(ei, 5)


def test_int32_edge_index_cached():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]], dtype=torch.int32)
    g = Graph.of(ei)
    assert Graph.of(ei) is g
    assert g.indptr.dtype == torch.int64


def test_weak_reference_entry_dies_with_tensor():
    ei, _ = random_edges(30, 30, 90, seed=4)
    g = Graph.of(ei)
    assert cached_count() == 1
    del ei
    gc.collect()
    assert cached_count() == 0
    assert g.num_edges > 0  # the Graph object itself stays usable


def test_weak_reference_many_tensors():
    keep = [random_edges(10, 10, 20, seed=s)[0] for s in range(5)]
    for t in keep:
        Graph.of(t)
    del t
    assert cached_count() == 5
    del keep[1:3]
    gc.collect()
    assert cached_count() == 3
    keep.clear()
    gc.collect()
    assert cached_count() == 0


def test_bound_respected():
    set_cache_size(3)
    assert cache_size() == 3
    tensors = [random_edges(10, 10, 20, seed=s)[0] for s in range(10)]
    graphs = [Graph.of(t) for t in tensors]
    assert cached_count() <= 3
    assert cached_count("cpu") == 3
    # least recently used go first: the last three are hits, the first is rebuilt
    for t, g in zip(tensors[-3:], graphs[-3:]):
        assert Graph.of(t) is g
    again = Graph.of(tensors[0])
    assert again is not graphs[0] and _same_csr(again, graphs[0])
    assert cached_count() == 3


def test_lru_order():
    set_cache_size(2)
    a, b, c = (random_edges(8, 8, 10, seed=s)[0] for s in range(3))
    ga, gb = Graph.of(a), Graph.of(b)
    assert Graph.of(a) is ga  # a is now most recent
    Graph.of(c)  # evicts b
    assert Graph.of(a) is ga
    assert Graph.of(b) is not gb


def test_shrinking_evicts():
    tensors = [random_edges(6, 6, 8, seed=s)[0] for s in range(6)]
    for t in tensors:
        Graph.of(t)
    assert cached_count() == 6
    set_cache_size(2)
    assert cached_count() == 2


@pytest.mark.parametrize("n", [0, -3])
def test_bad_cache_size(n):
    with pytest.raises(ValueError, match=rf"n must be >= 1, got {n}"):
        set_cache_size(n)


def test_clear_cache():
    ei, _ = random_edges(10, 10, 20, seed=5)
    g = Graph.of(ei)
    clear_cache()
    assert cached_count() == 0
    assert Graph.of(ei) is not g


def test_cached_count_per_device():
    ei, _ = random_edges(10, 10, 20, seed=5)
    Graph.of(ei)
    assert cached_count("cpu") == 1
    assert cached_count(torch.device("cpu")) == 1
    assert cached_count("meta") == 0


@pytest.mark.parametrize("bad", [[[0, 1], [1, 0]], "edge_index", 3])
def test_unsupported_object(bad):
    with pytest.raises(ValueError, match="obj must be an edge_index tensor") as info:
        Graph.of(bad)
    # the message names what the registered adapters take, and the type it got
    message = str(info.value)
    assert "a DGL graph or block (gnn_fastpath.integrations.dgl)" in message
    assert "a PyG EdgeIndex (gnn_fastpath.integrations.pyg)" in message
    assert message.endswith(f"got {type(bad).__name__}")


# ---------------------------------------------------------------------------- the generic cache
class _Source:
    """A weakly referenceable stand-in for any graph object."""


def test_cached_stores_any_value_and_checks_version_and_extra():
    src, calls = _Source(), []

    def build(tag):
        return lambda: calls.append(tag) or [tag]

    first = cached(src, 1, build("a"), "cpu")
    assert cached(src, 1, build("b"), "cpu") is first  # hit: builder not called
    assert calls == ["a"]
    second = cached(src, 2, build("c"), "cpu")  # version changed: rebuilt, replaced
    assert second == ["c"] and cached_count("cpu") == 1
    third = cached(src, 2, build("d"), "cpu", extra=(3, 4))  # extra is part of the match
    assert third == ["d"] and cached(src, 2, build("e"), "cpu", extra=(3, 4)) is third
    assert calls == ["a", "c", "d"]


def test_cached_is_per_device_and_weak():
    a, b = _Source(), _Source()
    cached(a, 0, object, "cpu")
    cached(b, 0, object, "meta")
    assert cached_count("cpu") == cached_count("meta") == 1
    del a
    gc.collect()
    assert cached_count("cpu") == 0 and cached_count("meta") == 1


def test_cached_builds_outside_the_lock():
    """A builder may use the cache itself (a derived graph built from another cached one)."""
    outer, inner = _Source(), _Source()
    value = cached(outer, 0, lambda: ("outer", cached(inner, 0, lambda: "inner", "cpu")), "cpu")
    assert value == ("outer", "inner") and cached_count("cpu") == 2


# ---------------------------------------------------------------------------- adapters
@pytest.fixture
def adapters():
    """Restores the adapter registry after a test that registers its own."""
    saved = list(graph_module._adapters)
    yield
    graph_module._adapters[:] = saved


class _EdgeList:
    """A foreign graph object: a list of (src, dst) pairs and a node count."""

    def __init__(self, pairs, n):
        self.pairs, self.n, self.version = pairs, n, 0


def _describe_edge_list(obj, num_nodes):
    def build():
        ei = torch.tensor(obj.pairs).t().reshape(2, -1)
        return Graph.from_edge_index(ei, obj.n if num_nodes is None else num_nodes)

    return "cpu", (obj.version, len(obj.pairs)), build


def test_registered_adapter_takes_foreign_objects(adapters):
    obj = _EdgeList([(0, 1), (2, 1)], 3)
    with pytest.raises(ValueError, match="got _EdgeList"):
        Graph.of(obj)
    register_adapter(lambda o: isinstance(o, _EdgeList), _describe_edge_list, "an _EdgeList (tests)")
    g = Graph.of(obj)
    assert (g.n_src, g.n_dst, g.num_edges) == (3, 3, 2) and g.in_degree().tolist() == [0, 2, 0]
    assert Graph.of(obj) is g
    assert Graph.of(obj, 5).n_dst == 5  # num_nodes reaches the adapter and the key
    obj.pairs.append((1, 0))
    obj.version += 1
    assert Graph.of(obj).num_edges == 3  # its version noticed the change
    with pytest.raises(ValueError, match=r"an _EdgeList \(tests\), got list"):
        Graph.of([1])


def test_registering_twice_is_a_no_op(adapters):
    def predicate(obj):
        return False

    register_adapter(predicate, _describe_edge_list)
    register_adapter(predicate, _describe_edge_list)
    assert sum(p is predicate for p, _, _ in graph_module._adapters) == 1


def test_later_adapter_wins_over_the_tensor_path(adapters):
    class Marked(torch.Tensor):
        pass

    def describe(obj, num_nodes):  # reads the marked tensor as reversed edges
        plain = obj.as_subclass(torch.Tensor)
        return str(obj.device), ("marked",) + (plain._version,), lambda: Graph.from_edge_index(plain.flip(0), num_nodes)

    ei = torch.tensor([[0, 0], [1, 2]])
    assert Graph.of(ei.as_subclass(Marked)).in_degree().tolist() == [0, 1, 1]
    register_adapter(lambda o: isinstance(o, Marked), describe)
    marked = ei.as_subclass(Marked)
    assert Graph.of(marked).in_degree().tolist() == [2, 0, 0]
    assert Graph.of(ei).in_degree().tolist() == [0, 1, 1]  # plain tensors keep the tensor path


def test_adapters_registered_lazily_without_importing_frameworks(pyg):
    """`import gnn_fastpath` registers the DGL and PyG adapters without importing DGL, PyG or
    their integration graph modules; an EdgeIndex imports the PyG one on first use."""
    code = textwrap.dedent("""
        import json, sys
        import gnn_fastpath
        mods = ("dgl", "torch_geometric", "gnn_fastpath.integrations.pyg.graph",
                "gnn_fastpath.integrations.dgl.graph")
        before = [m for m in mods if m in sys.modules]
        import torch
        from torch_geometric import EdgeIndex
        g = gnn_fastpath.Graph.of(EdgeIndex(torch.tensor([[0, 1], [1, 0]]), sparse_size=(4, 3)))
        print(json.dumps({"before": before, "sizes": [g.n_src, g.n_dst],
                          "pyg_graph": "gnn_fastpath.integrations.pyg.graph" in sys.modules}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"before": [], "sizes": [4, 3], "pyg_graph": True}


# ---------------------------------------------------------------------------- sparse adjacencies
def _quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def test_sparse_coo_cached_and_rebuilt():
    idx = torch.tensor([[1, 0, 2], [0, 2, 1]])  # rows are targets
    adj = torch.sparse_coo_tensor(idx, torch.ones(3), (3, 4))
    g = Graph.of(adj)
    assert (g.n_src, g.n_dst) == (4, 3)
    assert Graph.of(adj) is g
    adj._indices()[1, 0] = 3  # in-place write to the index storage
    g2 = Graph.of(adj)
    assert g2 is not g
    assert sorted(zip(g2.indices.tolist(), g2.dst_index().tolist())) == [(1, 2), (2, 0), (3, 1)]


def test_sparse_csr_cached_and_weak():
    adj = _quiet(lambda: torch.sparse_csr_tensor(torch.tensor([0, 1, 3]), torch.tensor([2, 0, 1]),
                                                 torch.ones(3), (2, 3)))
    g = Graph.of(adj)
    assert Graph.of(adj) is g
    assert (g.n_src, g.n_dst) == (3, 2)
    assert cached_count() == 1
    del adj
    gc.collect()
    assert cached_count() == 0


def test_pyg_edge_index_cached(pyg):
    from torch_geometric import EdgeIndex

    ei = EdgeIndex(torch.tensor([[0, 1, 2], [1, 0, 1]]), sparse_size=(3, 2))
    g = Graph.of(ei)
    assert (g.n_src, g.n_dst) == (3, 2)
    assert Graph.of(ei) is g
    assert type(g.indices) is torch.Tensor


# ----------------------------------------------------------------------- review findings
def test_graph_built_under_inference_mode_serves_training_later():
    """A Graph first built inside inference_mode (an eval pass) must not be made of inference
    tensors: a later training step saves its index tensors for backward."""
    import gnn_fastpath

    edge_index = torch.randint(0, 20, (2, 100))
    with torch.inference_mode():
        frozen = edge_index.clone()  # an inference tensor: no version counter
        graph = Graph.of(frozen)
        graph.dst_index(), graph.kernel_csr(), graph.source_csr(), graph.kernel_source_csr(), graph.caller_coo()
    assert Graph.of(frozen) is graph
    for t in (graph.indptr, graph.indices, graph.perm, graph.dst_index(), graph.kernel_csr().indices,
              graph.source_csr().indices, graph.kernel_source_csr().perm, *graph.caller_coo()):
        assert not t.is_inference()
    x = torch.randn(20, 8, requires_grad=True)
    gnn_fastpath.spmm(graph, x, norm="both").sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_edge_index_resized_in_place_rebuilds(pyg):
    from torch_geometric import EdgeIndex

    edge_index = EdgeIndex(torch.tensor([[0, 1], [1, 0]]), sparse_size=(2, 2))
    assert Graph.of(edge_index).n_dst == 2
    edge_index.sparse_resize_(5, 5)
    assert Graph.of(edge_index).n_dst == 5


def test_edge_index_written_in_place_rebuilds(pyg):
    """Writes through the EdgeIndex bump its own version; writes through as_tensor() bump only
    the wrapped tensor's: both must rebuild."""
    from torch_geometric import EdgeIndex

    edge_index = EdgeIndex(torch.tensor([[0, 1], [1, 0]]), sparse_size=(3, 3))
    assert Graph.of(edge_index).in_degree().tolist() == [1, 1, 0]
    edge_index[1, 0] = 2
    assert Graph.of(edge_index).in_degree().tolist() == [1, 0, 1]
    edge_index.as_tensor()[1, 1] = 2
    assert Graph.of(edge_index).in_degree().tolist() == [0, 0, 2]


@pytest.mark.parametrize("make, pattern", [
    (lambda: torch.tensor([[0, 2**40], [1, 0]]), r"edge_index \(source row\) contains node id 1099511627776"),
    (lambda: torch.tensor([[0, 1], [1, 0]], device="meta"), r"edge_index is on meta"),
    (lambda: torch.tensor([[0, 1], [1, 0]], dtype=torch.bool), r"edge_index must hold integer node ids"),
])
def test_rejected_input_caches_nothing_and_is_rejected_again(make, pattern):
    """Issue 15: a bad edge_index is a ValueError on every Graph.of call; no entry is left."""
    ei = make()
    for _ in range(2):
        with pytest.raises(ValueError, match=pattern):
            Graph.of(ei)
    assert cached_count() == 0


def test_huge_id_fixed_in_place_then_builds():
    ei = torch.tensor([[0, 2**40], [1, 0]])
    with pytest.raises(ValueError, match=r"contains node id 1099511627776"):
        Graph.of(ei)
    ei[0, 1] = 3  # the in-place fix bumps the version: Graph.of builds now
    assert Graph.of(ei).n_src == 4 and cached_count("cpu") == 1
