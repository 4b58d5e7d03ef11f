"""The block-sparse tensor-core SpMM (16-bit features) against the float64 reference: the
kernel on its layout, and the spmm op forced onto it (GNN_FASTPATH_SPMM_ALG=block), forward
and every gradient, on graphs with empty rows, duplicate edges, self loops, a super node and
bipartite shapes, for F in {8, 64, 72, 512} and results in the features' dtype or float32.

Bound (as test_spmm_half.py for cuSPARSE, which also takes A in B's type T): A's values are
rounded once to T, products and sums float32, one rounding to the result type O:
|out - want| <= 4 (u_O |want| + (u_T + eps) M), M = |A| |X|, eps = 2^-14 + k 2^-22 where k
is the most mma steps one output accumulates (one per block of its window): the tensor
cores' float32 accumulation is not rounded to nearest at every step."""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import block_spmm
from gnn_fastpath.cuda import spmm as spmm_kernels
from gnn_fastpath.ops import spmm
from zoo import random_edges

pytestmark = pytest.mark.cuda

U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _clustered(n=2000, m=30000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n, (m,), generator=gen)
    src = torch.clamp((dst // 64) * 64 + torch.randint(0, 64, (m,), generator=gen), max=n - 1)
    return torch.stack([src, dst]), n


GRAPHS = {
    "random": lambda: random_edges(300, 300, 3000, seed=1, empty_rows=20),
    "super": lambda: random_edges(2000, 2000, 20000, seed=2, empty_rows=10, super_node_degree=30000),
    "bipartite": lambda: random_edges(500, 301, 4000, seed=4, empty_rows=5),
    "clustered": _clustered,
}
_cache = {}


def _graph(name):
    if name not in _cache:
        ei, nn = GRAPHS[name]()
        _cache[name] = Graph.from_edge_index(ei.cuda(), nn)
    return _cache[name]


def _eps(layout, dtype):
    steps = int((layout.window_ptr[1:] - layout.window_ptr[:-1]).max()) if layout.n_windows else 0
    return U[dtype] + 2.0 ** -14 + steps * 2.0 ** -22


def _bound(got, want, magnitude, out_dtype, eps=2.0 ** -14):
    err = (got.double() - want).abs()
    limit = 4 * (U[out_dtype] * want.abs() + eps * magnitude) + 1e-30
    worst = (err / limit).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the bound"


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("F", [8, 64, 72, 512])
@pytest.mark.parametrize("out", ["same", torch.float32])
def test_kernel_matches_reference(name, dtype, F, out):
    g = _graph(name)
    kc = g.kernel_csr()
    layout = block_spmm.BlockLayout(kc.indptr, kc.indices, g.n_dst, g.n_src)
    values = torch.rand(g.num_edges, device="cuda") + 0.05
    x = torch.randn(g.n_src, F, device="cuda").to(dtype)
    out_dtype = dtype if out == "same" else out
    c = torch.full((g.n_dst, F), float("nan"), device="cuda", dtype=out_dtype)  # every row must be written
    block_spmm.matmul(layout, values, x, c)
    rows = torch.repeat_interleave(torch.arange(g.n_dst, device="cuda"), (kc.indptr[1:] - kc.indptr[:-1]).long())
    a = torch.zeros(g.n_dst, g.n_src, dtype=torch.float64, device="cuda")
    a.index_put_((rows, kc.indices.long()), values.double(), accumulate=True)
    want = a @ x.double()
    _bound(c, want, a.abs() @ x.double().abs(), out_dtype, _eps(layout, dtype))


@pytest.mark.parametrize("name", ["random", "bipartite", "clustered"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("norm", ["none", "both"])
@pytest.mark.parametrize("weighted", [False, True])
def test_op_forced_onto_the_block_kernel(monkeypatch, name, dtype, norm, weighted):
    """spmm with GNN_FASTPATH_SPMM_ALG=block: forward and backward (the transposed matrix's
    product on its own layout) and the edge-weight gradient, against the reference."""
    monkeypatch.setenv("GNN_FASTPATH_SPMM_ALG", "block")
    ei, nn = GRAPHS[name]()
    g = Graph.from_edge_index(ei.cuda(), nn)  # a fresh graph: its matrices are chosen under the setting
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(g.n_src, 64, device="cuda", generator=gen).to(dtype).requires_grad_(True)
    # weights in x's dtype: a 16-bit result, so dY is 16-bit and the backward's product can take
    # the block kernel too (float32 weights give a float32 result, which it does not take)
    w = (torch.rand(g.num_edges, device="cuda", generator=gen) + 0.1).to(dtype).requires_grad_(True) \
        if weighted else None
    out = spmm(g, x, w, norm=norm)
    dy = torch.randn(out.shape, device="cuda", generator=gen).to(out.dtype)
    out.backward(dy)
    xr = x.detach().double().requires_grad_(True)
    wr = None if w is None else w.detach().double().requires_grad_(True)
    want = reference.spmm(g, xr, wr, norm=norm)
    want.backward(dy.double())
    cache = spmm_kernels.cache_of(g)
    chosen = set(cache.csr.chosen_algorithms().values()) | set(cache.transposed().chosen_algorithms().values())
    assert chosen == {-3}, chosen  # cusparse.BLOCK, forward and backward
    xa = xr.detach().abs()
    wa = None if wr is None else wr.detach().abs()
    _bound(out, want.detach(), reference.spmm(g, xa, wa, norm=norm), dtype, _eps(cache.csr._block.layout, dtype))
    z = torch.zeros(g.n_src, 64, dtype=torch.float64, device="cuda", requires_grad=True)
    (reference.spmm(g, z, wa, norm=norm) * dy.double().abs()).sum().backward()  # z.grad = |A|^T |dY|
    _bound(x.grad, xr.grad, z.grad, dtype, _eps(cache.transposed()._block.layout, dtype))
    if weighted:  # the SDDMM (not the block kernel), rounded once to the weights' dtype
        torch.testing.assert_close(w.grad.double(), wr.grad, rtol=4 * U[dtype], atol=1e-3)


def test_timed_choice_offers_it_only_on_shared_columns():
    """The timed SpMM choice builds the layout only for 16-bit products, and keeps it only
    where the windows' rows share columns (clustered) and the kernel won."""
    g = _graph("clustered")
    x = torch.randn(g.n_src, 64, device="cuda").to(torch.bfloat16)
    spmm(g, x, norm="both")
    block = spmm_kernels.cache_of(g).csr._block
    assert block.unsuited is False
    chosen = spmm_kernels.cache_of(g).csr.chosen_algorithms()
    assert (block.layout is not None) == (-3 in chosen.values())
    r = _graph("random")
    spmm(r, torch.randn(r.n_src, 64, device="cuda").to(torch.bfloat16), norm="both")
    assert spmm_kernels.cache_of(r).csr._block.unsuited  # a random graph's windows share nothing
    f = _graph("super")
    spmm(f, torch.randn(f.n_src, 64, device="cuda"), norm="both")  # float32: never offered
    assert spmm_kernels.cache_of(f).csr._block.layout is None and not spmm_kernels.cache_of(f).csr._block.unsuited
