"""Dry launches of the gatv2_attention launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90:
float32, and 16-bit features (float16, bfloat16) with out_dtype T or float32 and a float32
``att``, over every vector width the 16-bit path picks (16-byte specialised and generic
rows, 8/4/2-byte and scalar rows, misaligned rows), with the dropout key from scalars (from
an rng tensor, the GF_DEVICE_RNG=1 module, over the main layouts)."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf, undirected_graph
from gnn_fastpath import Graph
from gnn_fastpath.cuda import gatv2_attention as kernels
from gnn_fastpath.cuda import launch
from gnn_fastpath.ops.gatv2_attention import GATv2AttentionFunction


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("H,D", [(2, 64), (3, 100), (1, 256)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_gatv2_attention_launches(launches, monkeypatch, graph_name, H, D, variant):
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", variant)
    g = graph(*GRAPHS[graph_name])
    xs, xd, att, et = leaf(g.n_src, H, D), leaf(g.n_dst, H, D), leaf(H, D), leaf(g.num_edges, H, D)
    out, alpha = GATv2AttentionFunction.apply(xs, xd, att, et, g, 0.2, "dropped", 0.1, 7, 9)
    (out.sum() + alpha.sum()).backward()
    assert {"gatv2_fwd", "gatv2_alpha_from_logits", "gatv2_delta_alpha", "gatv2_bwd_dst"} <= set(launches)
    assert ("gatv2_bwd_src" in launches) == (variant == "transposed")
    assert ("gatv2_fwd_merge" in launches) == (graph_name != "plain")
    assert xs.grad.shape == xs.shape and et.grad.shape == et.shape and att.grad.shape == att.shape


@pytest.mark.parametrize("super_node", [False, True])
@pytest.mark.parametrize("H,D", [(2, 64), (3, 100), (1, 256)])
def test_fused_backward_launches(launches, monkeypatch, super_node, H, D):
    """GNN_FASTPATH_GATV2_BWD=fused on an undirected graph: delta, then one pass for both
    gradients, no destination or source-major pass; on a directed graph it is the
    transposed variant."""
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", "fused")
    for g, fused in ((undirected_graph(super_node), True), (graph(super_node), False)):
        launches.clear()
        xs, xd, att, et = leaf(g.n_src, H, D), leaf(g.n_dst, H, D), leaf(H, D), leaf(g.num_edges, H, D)
        out, alpha = GATv2AttentionFunction.apply(xs, xd, att, et, g, 0.2, "dropped", 0.1, 7, 9)
        (out.sum() + alpha.sum()).backward()
        bwd = {"gatv2_delta", "gatv2_bwd_undirected"} if fused else {"gatv2_bwd_dst", "gatv2_bwd_src"}
        assert bwd | {"gatv2_delta_alpha"} <= set(launches)
        assert not ({"gatv2_delta", "gatv2_bwd_undirected", "gatv2_bwd_dst", "gatv2_bwd_src"} - bwd) & set(launches)
        assert xs.grad.shape == xs.shape and xd.grad.shape == xd.shape and et.grad.shape == et.shape


def test_reverse_ids_with_either_transpose():
    """The fused variant's reverse caller ids: the source-major CSR's own where the graph walks
    its forward CSR as its transpose; a copy of the same ids where a transpose was sorted before
    the symmetry was known."""
    base = graph(True)
    ei = torch.stack([base.indices, base.dst_index()])
    ei = torch.cat([ei, ei.flip(0)], 1)
    known = Graph.from_edge_index(ei, base.n_dst)
    assert known.is_symmetric()
    ids = kernels.reverse_ids(known)
    assert ids is known.kernel_source_csr().perm
    sorted_first = Graph.from_edge_index(ei, base.n_dst)
    scsr = sorted_first.kernel_source_csr()  # symmetry unknown: a sorted transpose
    assert sorted_first.is_symmetric() and scsr.indices is not sorted_first.kernel_csr().indices
    copy = kernels.reverse_ids(sorted_first)
    assert copy is not scsr.perm and copy.dtype == torch.int32
    assert torch.equal(copy.long(), sorted_first.perm[sorted_first.reverse_edges()]) and torch.equal(copy, ids)


def test_untuned_backward_leaves_symmetry_unread(launches, monkeypatch):
    """Without tuning the backward stays atomic on a graph used again, and never pays the
    symmetry detection (host reads) that only the fused variant needs."""
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    base = graph(True)
    ei = torch.stack([base.indices, base.dst_index()])
    g = Graph.from_edge_index(torch.cat([ei, ei.flip(0)], 1), base.n_dst)  # symmetric, not yet known
    xs, xd, att = leaf(g.n_src, 2, 64), leaf(g.n_dst, 2, 64), leaf(2, 64)
    for _ in range(2):  # the second step: the graph outlived one
        GATv2AttentionFunction.apply(xs, xd, att, None, g, 0.2, False, 0.0, 7, 9).sum().backward()
    assert g.outlived_a_step() and "reverse_edges" not in g._memo
    assert "gatv2_bwd_dst" in launches and "gatv2_bwd_undirected" not in launches


def _leaf(*shape, dtype, offset=0):
    """A leaf of ``dtype``; ``offset`` elements into its storage (misaligned rows)."""
    n = 1
    for s in shape:
        n *= s
    return torch.randn(n + offset).to(dtype)[offset:].view(*shape).requires_grad_()


#: The backward kernels of each variant (the rest of BACKWARD_KERNELS must not run).
BACKWARD_KERNELS = {"atomic": {"gatv2_bwd_dst"}, "transposed": {"gatv2_bwd_dst", "gatv2_bwd_src"},
                    "fused": {"gatv2_delta", "gatv2_bwd_undirected"}}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("H,D,offset,vw", [(2, 64, 0, 8), (4, 32, 0, 8), (1, 256, 0, 8), (2, 128, 0, 8),
                                           (2, 8, 0, 8), (3, 100, 0, 4), (2, 64, 4, 4), (1, 6, 0, 2),
                                           (2, 7, 0, 1)])
@pytest.mark.parametrize("variant", list(BACKWARD_KERNELS))
@pytest.mark.parametrize("vec16", ["16", "8"])
def test_gatv2_attention_launches_16bit(launches, monkeypatch, dtype, out_fp32, H, D, offset, vw, variant, vec16):
    """Split rows both ways (the float32 accumulators of chunked rows): a bipartite graph, and
    for the one-pass backward an undirected one."""
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", variant)
    monkeypatch.setenv("GNN_FASTPATH_VEC16", vec16)  # 8: at most 4 halves per access (float32 layout)
    vw = vw if vec16 == "16" else min(vw, 4)
    g = undirected_graph(True) if variant == "fused" else graph(True, True)
    xs = _leaf(g.n_src, H, D, dtype=dtype, offset=offset)
    xd, et = _leaf(g.n_dst, H, D, dtype=dtype), _leaf(g.num_edges, H, D, dtype=dtype)
    att = _leaf(H, D, dtype=torch.float32 if out_fp32 else dtype)
    out_dtype = torch.float32 if out_fp32 else dtype
    assert kernels._config(D, xs.detach(), xd, att.detach().float(), et).vw == vw
    out, alpha = GATv2AttentionFunction.apply(xs, xd, att, et, g, 0.2, True, 0.1, 7, 9, out_dtype)
    assert out.dtype == alpha.dtype == out_dtype
    (out.float().sum() + alpha.float().sum()).backward()
    bwd = BACKWARD_KERNELS[variant]
    assert {"gatv2_fwd", "gatv2_fwd_merge", "gatv2_alpha_from_logits", "gatv2_delta_alpha"} | bwd <= set(launches)
    assert not (set().union(*BACKWARD_KERNELS.values()) - bwd) & set(launches)
    for t in (xs, xd, att, et):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_gatv2_configs(monkeypatch):
    """float32 keeps its instantiations; 16-bit rows take the float32 lane layout (4 halves,
    8-byte accesses) by default, and 8 elements per lane where they can with
    GNN_FASTPATH_VEC16=16."""
    x16 = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    assert kernels.config_for_16bit(64, x16) == kernels.config_for(64, True)
    monkeypatch.setenv("GNN_FASTPATH_VEC16", "16")
    f32 = [kernels.config_for(D, True) for D in (32, 64, 128, 256, 100)]
    assert [(c.vw, c.lh, c.k, c.dc, c.u) for c in f32] == [(4, 8, 1, 32, 4), (4, 16, 1, 64, 4), (4, 32, 1, 128, 4),
                                                          (4, 32, 2, 256, 2), (1, 32, 4, 0, 4)]
    assert kernels.config_for(64, False) == kernels.Config(1, 32, 2, 0, 4)
    assert kernels.forward_config(f32[1], torch.float32) == f32[1]
    x = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    assert kernels.config_for_16bit(64, x) == kernels.Config(8, 8, 1, 64, 2)
    assert kernels.forward_config(kernels.config_for_16bit(64, x), torch.bfloat16).u == 4
    assert kernels.config_for_16bit(8, x) == kernels.Config(8, 1, 1, 0, 2)
    assert kernels.config_for_16bit(100, x) == kernels.Config(4, 32, 1, 0, 4)
    assert kernels.forward_config(kernels.config_for_16bit(100, x), torch.bfloat16).u == 4
    off8 = torch.zeros(x.numel() + 4, dtype=torch.bfloat16)[4:].view_as(x)  # 8-byte aligned only
    assert kernels.config_for_16bit(64, off8) == kernels.Config(4, 16, 1, 64, 4)
    assert kernels.forward_config(kernels.config_for_16bit(64, off8), torch.bfloat16).u == 4
    assert kernels.config_for_16bit(7, x).vw == 1


def _record_rng(monkeypatch):
    """{kernel name: (rng, seed, offset)} of every dry launch of a kernel with a dropout stream."""
    seen, dry = {}, launch.Kernel.launch
    def record(self, grid, block, **args):
        if "rng" in args:
            seen[self.name.split("<")[0]] = (args["rng"], args["seed"], args["offset"])
        dry(self, grid, block, **args)
    monkeypatch.setattr(launch.Kernel, "launch", record)
    return seen


def _stream_kernels(family):
    """Names of the kernels ``family`` compiled (the dry-launch fixture empties its cache per test)."""
    return {name for _, name, _ in family._cache}


@pytest.mark.parametrize("dtype,H,D,vec16,edge_term", [
    (torch.float32, 2, 64, "8", True), (torch.float32, 2, 128, "8", False), (torch.float32, 1, 256, "8", False),
    (torch.float32, 3, 100, "8", True), (torch.bfloat16, 2, 64, "16", True), (torch.float16, 2, 7, "8", False)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_rng_tensor(launches, monkeypatch, variant, dtype, H, D, vec16, edge_term):
    """The dropout stream as an int64 tensor [2] (seed, offset None), as under CUDA graphs: every
    kernel with a stream gets it as rng, with scalar seed = offset = 0, compiled with
    GF_DEVICE_RNG=1 (KERNELS_RNG); ints give rng None and the kernels without it (KERNELS)."""
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", variant)
    monkeypatch.setenv("GNN_FASTPATH_VEC16", vec16)
    g = graph(True)
    seen = _record_rng(monkeypatch)
    rng = torch.tensor([7, 9])
    xs, xd = _leaf(g.n_src, H, D, dtype=dtype), _leaf(g.n_dst, H, D, dtype=dtype)
    att, et = leaf(H, D), _leaf(g.num_edges, H, D, dtype=dtype) if edge_term else None
    out, alpha = GATv2AttentionFunction.apply(xs, xd, att, et, g, 0.2, "dropped", 0.1, rng, None)
    (out.float().sum() + alpha.float().sum()).backward()
    expected = {"gatv2_fwd", "gatv2_alpha_from_logits", "gatv2_bwd_dst"} | ({"gatv2_bwd_src"} if variant == "transposed"
                                                                           else set())
    assert set(seen) == expected
    assert all(r is rng and (sd, off) == (0, 0) for r, sd, off in seen.values())
    assert dict(kernels.KERNELS_RNG.defines)["GF_DEVICE_RNG"] == 1 and "GF_DEVICE_RNG" not in \
        dict(kernels.KERNELS.defines)
    assert _stream_kernels(kernels.KERNELS_RNG) == expected
    assert not _stream_kernels(kernels.KERNELS) & expected
    seen.clear()
    GATv2AttentionFunction.apply(xs, xd, att, None, g, 0.2, False, 0.1, 7, 9).float().sum().backward()
    assert set(seen) == expected - {"gatv2_alpha_from_logits"} and all(v == (None, 7, 9) for v in seen.values())
    assert expected - {"gatv2_alpha_from_logits"} <= _stream_kernels(kernels.KERNELS)


def test_rng_tensor_shared_memory(launches, monkeypatch):
    """att's gradient in shared memory (48 KiB at most without an opt-in) leaves room for the
    device key (static shared memory of the GF_DEVICE_RNG=1 kernels): H * D * 4 = 48 KiB
    takes it with an int stream only."""
    g = graph(False)
    smem, dry = {}, launch.Kernel.launch
    def record(self, grid, block, shared_mem=0, **args):
        if self.name.startswith("gatv2_bwd_dst"):
            smem[args["rng"] is not None] = shared_mem
        dry(self, grid, block, shared_mem=shared_mem, **args)
    monkeypatch.setattr(launch.Kernel, "launch", record)
    xs, xd, att = leaf(g.n_src, 48, 256), leaf(g.n_dst, 48, 256), leaf(48, 256)
    for seed, offset in ((7, 9), (torch.tensor([7, 9]), None)):
        GATv2AttentionFunction.apply(xs, xd, att, None, g, 0.2, False, 0.1, seed, offset).sum().backward()
    assert smem == {False: 48 * 1024, True: 0}


# ------------------------------------------------------------------------ the rule
def _ring(n=64, both_ways=True):
    """A ring of n nodes: mean in-degree 2 both ways (undirected), 1 one way (directed)."""
    src = torch.arange(n)
    ei = torch.stack([src, (src + 1) % n])
    return Graph.from_edge_index(torch.cat([ei, ei.flip(0)], 1) if both_ways else ei, n)


def _outlive(g):
    g.note_pass("backward")
    g.note_pass("forward")
    assert g.outlived_a_step()
    return g


def test_backward_rule(monkeypatch):
    """The rule without tuning: atomic, except the one-pass backward for 16-bit rows on an
    undirected graph of at most FUSED_MAX_MEAN_DEGREE in-edges per node that outlived a step
    (roads-like in bf16; benchmarks/RESULTS.md, tuning); symmetry is read only
    for such graphs; a forced variant wins."""
    from gnn_fastpath.graph.tensors import as_graph, of_graph

    low = _ring()
    assert low.num_edges <= kernels.FUSED_MAX_MEAN_DEGREE * low.n_dst
    for dtype in (torch.float16, torch.bfloat16):  # one step only: no symmetry read, atomics
        assert kernels.backward_mode(low, dtype) == "atomic"
    assert "reverse_edges" not in low._memo
    _outlive(low)
    assert kernels.backward_mode(low, torch.float32) == "atomic" and "reverse_edges" not in low._memo
    for dtype in (torch.float16, torch.bfloat16):
        assert kernels.backward_mode(low, dtype) == "fused"
    dense = _outlive(undirected_graph(False))  # symmetric (known), in-degree above the bound
    assert dense.num_edges > kernels.FUSED_MAX_MEAN_DEGREE * dense.n_dst
    assert kernels.backward_mode(dense, torch.bfloat16) == "atomic"
    directed = _outlive(_ring(both_ways=False))  # low degree, not symmetric
    assert kernels.backward_mode(directed, torch.bfloat16) == "atomic"
    bipartite = _outlive(graph(False, True))
    assert kernels.backward_mode(bipartite, torch.bfloat16) == "atomic"
    static = as_graph(of_graph(_ring()))
    assert static.static and kernels.backward_mode(static, torch.bfloat16) == "atomic"
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", "transposed")
    assert kernels.backward_mode(low, torch.bfloat16) == "transposed"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_untuned_low_degree_undirected_backward(launches, monkeypatch, dtype):
    """GNN_FASTPATH_TUNE=0 on a low-degree undirected graph: the first step's backward is the
    atomic pass; from the second step on (the graph outlived one) bf16 takes the one pass over
    the forward CSR, float32 stays atomic."""
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    g = _ring()
    xs, xd, att = _leaf(g.n_src, 2, 64, dtype=dtype), _leaf(g.n_dst, 2, 64, dtype=dtype), \
        _leaf(2, 64, dtype=torch.float32)
    seen = []
    for _ in range(2):
        out = GATv2AttentionFunction.apply(xs, xd, att, None, g, 0.2, False, 0.0, 7, 9)
        start = len(launches)
        out.float().sum().backward()
        seen.append(set(launches[start:]))
    assert "gatv2_bwd_dst" in seen[0] and "gatv2_bwd_undirected" not in seen[0]
    fused = dtype != torch.float32
    assert ("gatv2_bwd_undirected" in seen[1]) == fused and ("gatv2_bwd_dst" in seen[1]) == (not fused)
