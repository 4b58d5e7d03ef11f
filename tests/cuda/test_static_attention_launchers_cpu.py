"""Dry launches (see dry_launch.py) of the three attention families on a *static* Graph, the
compiled path's (``graph.tensors.as_graph``): long rows are split by the static work list
(``worklist.build_static``), so the chunk merges and split-row accumulators run there too,
in float32 and 16-bit, with every backward variant that walks destinations or sources."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, extra_row_graph, graph
from gnn_fastpath.cuda import launch
from gnn_fastpath.graph.tensors import as_graph, of_graph
from gnn_fastpath.ops.dot_attention import DotAttentionFunction
from gnn_fastpath.ops.gat_attention import GATAttentionFunction
from gnn_fastpath.ops.gatv2_attention import GATv2AttentionFunction


def _static(name):
    g = as_graph(of_graph(graph(*GRAPHS[name])))
    assert g.static
    return g


def _leaf(*shape, dtype):
    return torch.randn(*shape).to(dtype).requires_grad_()


def _record_work(monkeypatch):
    """{kernel name: (n_work or n_items or n_split, grid)} of every dry launch."""
    seen, dry = {}, launch.Kernel.launch

    def record(self, grid, block, **args):
        n = next((args[k] for k in ("n_work", "n_items", "n_split") if k in args), None)
        seen[self.name.split("<")[0]] = (n, grid)
        dry(self, grid, block, **args)

    monkeypatch.setattr(launch.Kernel, "launch", record)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_gatv2_on_a_static_graph(launches, monkeypatch, dtype, graph_name, variant):
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", variant)
    seen = _record_work(monkeypatch)
    g = _static(graph_name)
    H, D = 2, 64
    xs, xd, et = _leaf(g.n_src, H, D, dtype=dtype), _leaf(g.n_dst, H, D, dtype=dtype), \
        _leaf(g.num_edges, H, D, dtype=dtype)
    att = _leaf(H, D, dtype=torch.float32)
    out, alpha = GATv2AttentionFunction.apply(xs, xd, att, et, g, 0.2, True, 0.1, torch.tensor([7, 9]), None)
    (out.float().sum() + alpha.float().sum()).backward()
    # every row has a split entry in a static list: the merge runs on every graph, the plain
    # one included (where no entry has chunks and the kernel skips them all)
    assert {"gatv2_fwd", "gatv2_fwd_merge", "gatv2_bwd_dst"} <= set(launches)
    assert seen["gatv2_fwd_merge"][0] == g.n_dst
    assert seen["gatv2_fwd"][0] == (g.n_dst + g.num_edges // 256) * 1  # one head tile of 2 x 64
    assert ("gatv2_bwd_src" in launches) == (variant == "transposed")
    for t in (xs, xd, att, et):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_gat_on_a_static_graph(launches, dtype, graph_name):
    g = _static(graph_name)
    H, D = 2, 64
    xs = _leaf(g.n_src, H, D, dtype=dtype)
    s, t, u = _leaf(g.n_src, H, dtype=torch.float32), _leaf(g.n_dst, H, dtype=torch.float32), \
        _leaf(g.num_edges, H, dtype=torch.float32)
    out, alpha = GATAttentionFunction.apply(xs, s, t, u, None, g, 0.2, "dropped", 0.1, torch.tensor([7, 9]), None,
                                            None)
    (out.float().sum() + alpha.float().sum()).backward()
    assert {"gat_fwd", "gat_fwd_merge", "gat_bwd_dst"} <= set(launches)  # static: the atomic backward
    for x in (xs, s, t, u):
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_dot_on_a_static_graph(launches, monkeypatch, dtype, graph_name, variant):
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", variant)
    g = _static(graph_name)
    H, D = 4, 32
    q, k, v = _leaf(g.n_dst, H, D, dtype=dtype), _leaf(g.n_src, H, D, dtype=dtype), _leaf(g.n_src, H, D, dtype=dtype)
    et = _leaf(g.num_edges, H, D, dtype=dtype)
    out, alpha = DotAttentionFunction.apply(q, k, v, et, g, 0.125, True, 0.1, torch.tensor([7, 9]), None, None)
    (out.float().sum() + alpha.float().sum()).backward()
    assert {"dot_fwd", "dot_fwd_merge", "dot_bwd_dst", "dot_sum_partials"} <= set(launches)
    assert ("dot_bwd_src" in launches) == (variant == "transposed")
    for x in (q, k, v, et):
        assert x.grad.shape == x.shape and x.grad.dtype == dtype


# ------------------------------------------------------------------------ tuned backward
@pytest.mark.parametrize("family", ["gat", "dot"])
def test_tuned_backward_times_both_variants_once_per_class(launches, monkeypatch, tmp_path, family):
    """GNN_FASTPATH_TUNE=1, a race that fits at once: the first backward of a size class probes
    the rule's variant, then races both (timed; here a fake timer calls the one the rule does
    not pick faster), the call runs the winner, the choice is kept, and a second graph of the
    same class runs only it; a forced GNN_FASTPATH_*_BWD, static graphs and graphs in their
    first training step (a sampled batch: the transposed pass's set-up would not pay) are not
    tuned. A race that does not fit yet: the probe, then the rule's variant, nothing more timed."""
    from gnn_fastpath import tuning
    from gnn_fastpath.cuda import dot_attention, gat_attention

    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tmp_path / "tuning.json"))
    monkeypatch.setattr(tuning, "FREE_MS", float("inf"))  # the budget's own tests: tests/test_tuning.py
    tuning.forget()
    timed = []

    def used_again(g):
        for event in ("forward", "backward", "forward"):
            g.note_pass(event)
        return g

    g = used_again(graph(False, True))
    rule = (gat_attention if family == "gat" else dot_attention).backward_mode(g)
    faster = "atomic" if rule == "transposed" else "transposed"

    def timer(run, device, calls):
        n = len(launches)
        run()
        variant = "transposed" if any(name.endswith("_bwd_src") for name in launches[n:]) else "atomic"
        timed.append(variant)
        return 1.0 if variant == faster else 2.0

    monkeypatch.setattr(tuning, "_time_ms", timer)
    H, D = 2, 32

    def step(g):
        if family == "gat":
            xs = _leaf(g.n_src, H, D, dtype=torch.float32)
            s, t = _leaf(g.n_src, H, dtype=torch.float32), _leaf(g.n_dst, H, dtype=torch.float32)
            out = GATAttentionFunction.apply(xs, s, t, None, None, g, 0.2, False, 0.0, 0, 0, None)
        else:
            q, k, v = (_leaf(n, H, D, dtype=torch.float32) for n in (g.n_dst, g.n_src, g.n_src))
            out = DotAttentionFunction.apply(q, k, v, None, g, 0.125, False, 0.0, 0, 0, None)
        start = len(launches)
        out.sum().backward()
        return launches[start:]

    def ran_transposed(names):
        return any(name.endswith("_bwd_src") for name in names)

    first = step(g)
    # the probe (the rule's variant twice), the other's warm-up, one round: the rule's variant,
    # twice as slow, leaves the race after it
    assert timed == [rule, rule, faster, rule, faster] if rule == "atomic" else timed == [rule, rule, faster,
                                                                                         faster, rule]
    n_timed = len(timed)
    # after timing, the call itself runs the faster variant (its last launches)
    n_last = 1 if faster == "atomic" else 2
    assert ran_transposed(first[-n_last:]) == (faster == "transposed")
    rows = tuning.listing(all_devices=True)
    assert [(r["choice"], r["default"]) for r in rows] == [(faster, rule)]
    again = step(used_again(graph(False, True)))  # a new Graph of the same class: the remembered choice, untimed
    assert len(timed) == n_timed and ran_transposed(again) == (faster == "transposed")
    fresh = graph(False, True)  # its first step: the rule, never the tuner
    one_step = step(fresh)
    assert len(timed) == n_timed
    assert ran_transposed(one_step) == ((gat_attention if family == "gat" else dot_attention).backward_mode(fresh)
                                        == "transposed")
    monkeypatch.setenv(f"GNN_FASTPATH_{family.upper()}_BWD", "atomic")  # forced: neither timed nor tuned
    forced = step(used_again(graph(True)))
    assert len(timed) == n_timed and not ran_transposed(forced)
    monkeypatch.delenv(f"GNN_FASTPATH_{family.upper()}_BWD")
    static = step(_static("super_node"))  # static graphs: the rule (atomic), never timed
    assert len(timed) == n_timed and not ran_transposed(static)

    # a race that does not fit its allowance yet (a new process, no FREE_MS): the first call
    # probes, every call runs the rule's variant
    monkeypatch.setattr(tuning, "FREE_MS", 0.0)
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tmp_path / "fresh.json"))
    tuning.forget()
    timed.clear()
    for _ in range(3):
        names = step(used_again(graph(False, True)))
        assert names and ran_transposed(names) == (rule == "transposed")
    assert timed == [rule, rule]
    (entry,) = tuning.report()["classes"].values()
    assert entry["state"] == tuning.WAITING and entry["calls"] == 3 and entry["trials"] == 2
    assert tuning.listing(all_devices=True) == []
    tuning.forget()


# ------------------------------------------------------------- the extra row of removed edges
#: per-edge outputs of each family's kernels (what the kernels write only for edges they walk)
PER_EDGE = ("alpha", "logits", "d_edge_term", "d_edge_score")


@pytest.mark.parametrize("variant", ["atomic", "transposed"])
@pytest.mark.parametrize("family", ["gatv2", "gat", "dot"])
def test_extra_row_graph_walks_destinations_and_zeroes_per_edge_outputs(launches, monkeypatch, family, variant):
    """With the list that leaves out the extra row (the compiled path's, for a layer that
    removed edges), a forced source-major backward runs the destination pass instead (the
    transpose holds the removed edges, whose empty row has lse = -inf), and every per-edge
    output reaches its kernel zeroed: its removed edges' entries are never written.
    ``torch.empty`` gives NaN here, so an unzeroed buffer shows."""
    from gnn_fastpath.cuda import dot_attention, gat_attention, gatv2_attention

    monkeypatch.setenv(f"GNN_FASTPATH_{family.upper()}_BWD", variant)
    real_empty = torch.empty

    def nan_empty(*shape, **kw):
        t = real_empty(*shape, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)
    per_edge, dry = [], launch.Kernel.launch

    def record(self, grid, block, **args):
        per_edge.extend((self.name.split("<")[0], k, int(torch.count_nonzero(v.nan_to_num(1.0))))
                        for k, v in args.items() if k in PER_EDGE and v is not None)
        dry(self, grid, block, **args)

    monkeypatch.setattr(launch.Kernel, "launch", record)
    gt = extra_row_graph()[0].destination_major()
    n = gt.n_src
    module = {"gatv2": gatv2_attention, "gat": gat_attention, "dot": dot_attention}[family]
    g = as_graph(gt.with_geometry(module.static_geometry()))
    H, D, M = 2, 64, gt.num_edges
    f32, rng = torch.float32, torch.tensor([7, 9])
    if family == "gatv2":
        xs, xd, et = _leaf(n, H, D, dtype=f32), _leaf(n + 1, H, D, dtype=f32), _leaf(M, H, D, dtype=f32)
        out, alpha = GATv2AttentionFunction.apply(xs, xd, _leaf(H, D, dtype=f32), et, g, 0.2, True, 0.1, rng, None)
    elif family == "gat":
        xs, et = _leaf(n, H, D, dtype=f32), _leaf(M, H, dtype=f32)
        out, alpha = GATAttentionFunction.apply(xs, _leaf(n, H, dtype=f32), _leaf(n + 1, H, dtype=f32), et, None, g,
                                                0.2, True, 0.1, rng, None, None)
    else:
        q, et = _leaf(n + 1, H, D, dtype=f32), _leaf(M, H, D, dtype=f32)
        out, alpha = DotAttentionFunction.apply(q, _leaf(n, H, D, dtype=f32), _leaf(n, H, D, dtype=f32), et, g,
                                                0.125, True, 0.1, rng, None, None)
    (out.nan_to_num().sum() + alpha.nan_to_num().sum()).backward()
    assert f"{family}_bwd_dst" in launches and f"{family}_bwd_src" not in launches
    names = {k for _, k, _ in per_edge}
    assert "alpha" in names and ({"d_edge_term", "d_edge_score"} & names)
    assert all(nonzero == 0 for _, _, nonzero in per_edge), per_edge
    assert et.grad is not None
