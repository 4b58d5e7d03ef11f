"""Source-major backward passes on an undirected graph: walking the forward CSR as its own
transpose (symmetry known) gives exactly what the sorted transpose gives (symmetry unknown),
for every op with a source-major pass (equal up to the order of float atomics: GATv2's
attention-vector gradient sums every edge's share with them)."""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath import Graph
from gnn_fastpath.ops import dot_attention, gat_attention, gatv2_attention, segment_reduce
from zoo import random_edges

pytestmark = pytest.mark.cuda

H, D = 2, 16

#: op -> (setting that forces its source-major backward, the call on (graph, leaves))
OPS = {
    "dot_attention": ("GNN_FASTPATH_DOT_BWD", lambda g, t: dot_attention(g, *t)),
    "gat_attention": ("GNN_FASTPATH_GAT_BWD", lambda g, t: gat_attention(g, *t)),
    "gatv2_attention": ("GNN_FASTPATH_GATV2_BWD", lambda g, t: gatv2_attention(g, *t)),
    "segment_reduce": ("GNN_FASTPATH_SR_BWD", lambda g, t: segment_reduce(g, *t, "max")),
}


def _edges():
    """Undirected: random pairs (self loops, duplicates) both ways, and a node joined to 900
    others (a long row both ways, cut into chunks)."""
    ei, _ = random_edges(600, 600, 5000, seed=8)
    hub = torch.randint(1, 600, (900,), generator=torch.Generator().manual_seed(8))
    ei = torch.cat([ei, torch.stack([torch.zeros_like(hub), hub])], 1)
    return torch.cat([ei, ei.flip(0)], 1).cuda()


def _leaves(op, n):
    gen = torch.Generator(device="cuda").manual_seed(3)

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).requires_grad_(True)

    if op == "dot_attention":
        return [leaf(n, H, D), leaf(n, H, D), leaf(n, H, D)]
    if op == "gat_attention":
        return [leaf(n, H, D), leaf(n, H), leaf(n, H)]
    if op == "gatv2_attention":
        return [leaf(n, H, D), leaf(n, H, D), leaf(H, D)]
    return [leaf(n, 64)]


@pytest.mark.parametrize("op", list(OPS))
def test_forward_csr_walk_equals_the_transpose(monkeypatch, op):
    setting, call = OPS[op]
    monkeypatch.setenv(setting, "transposed")
    results = []
    for known in (True, False):
        graph = Graph.from_edge_index(_edges(), 600)
        if known:
            assert graph.is_symmetric()
        leaves = _leaves(op, 600)
        out = call(graph, leaves)
        out.backward(torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(5)))
        results.append([out.detach()] + [t.grad for t in leaves])
        shared = graph.kernel_source_csr().indices is graph.kernel_csr().indices
        # min/max detects symmetry itself; the attention passes use it where it is known
        assert shared == (known or op == "segment_reduce")
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
