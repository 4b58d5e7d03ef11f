"""Plans (gnn_fastpath.cuda.plans) on the CPU: one plan per call signature, cached on the Graph;
a changed setting makes a new one; each family's rule reaches the launch through its plan; the
tuner settles a pending plan once its choice is final; the stats view lists what ran."""
from __future__ import annotations

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import Graph
from gnn_fastpath.cuda import dot_attention, gat_attention, gatv2_attention, plans, segment_reduce, spmm
from zoo import random_edges


def _graph(n=60, m=400, seed=3):
    ei, nn = random_edges(n, n, m, seed=seed)
    return Graph.from_edge_index(ei, nn)


def _outlive(g):
    for event in ("forward", "backward", "forward"):
        g.note_pass(event)
    assert g.outlived_a_step()
    return g


@pytest.fixture(autouse=True)
def _no_tuning(monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    for name in ("GNN_FASTPATH_GAT_BWD", "GNN_FASTPATH_GATV2_BWD", "GNN_FASTPATH_DOT_BWD", "GNN_FASTPATH_DOT_FWD",
                 "GNN_FASTPATH_SR_BWD", "GNN_FASTPATH_SR_CHUNKS", "GNN_FASTPATH_SR_SCATTER", "GNN_FASTPATH_VEC16",
                 "GNN_FASTPATH_SPMM_BWD", "GNN_FASTPATH_SPMM_ALG"):
        monkeypatch.delenv(name, raising=False)
    plans.reset_report()


def _gat_rows(g, dtype=torch.float32, H=2, D=32):
    x = torch.randn(g.n_src, H, D).to(dtype)
    out = torch.empty(g.n_dst, H, D, dtype=dtype)
    return x, out, torch.randn(g.n_dst, H, D).to(dtype)


def test_same_key_same_plan_and_one_rule_evaluation(monkeypatch):
    """Same signature: the cached plan object itself, the rule not evaluated again."""
    g = _graph()
    calls = []
    rule = gat_attention.backward_mode
    monkeypatch.setattr(gat_attention, "backward_mode", lambda *a: calls.append(a) or rule(*a))
    x, out, gout = _gat_rows(g)
    built = plans.build_counts["gat_attention.backward"]
    first = gat_attention.plan_backward(g, x, out, gout)
    x2, out2, gout2 = _gat_rows(g)  # new tensors of the same signature
    second = gat_attention.plan_backward(g, x2, out2, gout2)
    assert second is first and len(calls) == 1
    assert plans.build_counts["gat_attention.backward"] == built + 1
    assert first.variant == "atomic" and first.decided_by == "rule" and first.cfg == gat_attention._config(32, x, out, gout)
    other = gat_attention.plan_backward(_graph(seed=4), x, out, gout)  # another graph: its own plan
    assert other is not first and len(calls) == 2


def test_changed_setting_makes_a_new_plan(monkeypatch):
    g = _graph()
    x, out, gout = _gat_rows(g)
    rule = gat_attention.plan_backward(g, x, out, gout)
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", "transposed")
    forced = gat_attention.plan_backward(g, x, out, gout)
    assert forced is not rule and forced.variant == "transposed" and forced.decided_by == "setting"
    monkeypatch.delenv("GNN_FASTPATH_GAT_BWD")
    assert gat_attention.plan_backward(g, x, out, gout) is rule  # back to the first signature's plan
    monkeypatch.setenv("GNN_FASTPATH_VEC16", "16")  # 16-bit rows: the instantiation follows the setting
    xb, outb, goutb = _gat_rows(g, torch.bfloat16)
    wide = gat_attention.plan_backward(g, xb, outb, goutb)
    monkeypatch.setenv("GNN_FASTPATH_VEC16", "8")
    narrow = gat_attention.plan_backward(g, xb, outb, goutb)
    assert (wide.cfg.vw, narrow.cfg.vw) == (8, 4)


def test_graph_state_is_part_of_the_key():
    """A rule that reads whether the graph outlived a step sees the change: a new plan."""
    src = torch.arange(200) % 40
    dst = torch.arange(200) % 10  # 10 destinations of 20 in-edges, 40 sources of 5 out-edges
    g = Graph.from_edge_index(torch.stack([src, dst]), (40, 10))
    x, out, gout = _gat_rows(g, torch.bfloat16)
    assert gat_attention.plan_backward(g, x, out, gout).variant == "atomic"  # one step: atomics
    _outlive(g)
    assert gat_attention.plan_backward(g, x, out, gout).variant == gat_attention.backward_mode(g, torch.bfloat16) \
        == "transposed"


def test_alignment_is_part_of_the_key():
    g = _graph()
    buf = torch.randn(g.n_src * 2 * 32 + 2).to(torch.bfloat16)
    aligned = buf[:g.n_src * 64].view(g.n_src, 2, 32)
    shifted = buf[2:2 + g.n_src * 64].view(g.n_src, 2, 32)  # 4 bytes off
    out = torch.empty(g.n_dst, 2, 32, dtype=torch.bfloat16)
    a = gat_attention.plan_forward(g, aligned, out)
    b = gat_attention.plan_forward(g, shifted, out)
    assert a is not b and a.cfg.vw > b.cfg.vw


def test_each_rule_reaches_its_plan(monkeypatch):
    """Every family's rule decides its plan's variant where no setting forces one."""
    monkeypatch.setattr(segment_reduce.launch, "l2_bytes", lambda device: 1 << 40)  # no GPU here
    sparse = _outlive(_graph(200, 300))  # few edges per node
    dense = _outlive(_graph(40, 1200, seed=5))
    # GAT
    for g in (sparse, dense):
        for dtype in (torch.float32, torch.bfloat16):
            x, out, gout = _gat_rows(g, dtype)
            assert gat_attention.plan_backward(g, x, out, gout).variant == gat_attention.backward_mode(g, dtype)
    # GATv2: the one-pass variant for 16-bit rows on an undirected graph of few in-edges
    ei = torch.stack([sparse.indices, sparse.dst_index()])
    und = _outlive(Graph.from_edge_index(torch.cat([ei, ei.flip(0)], 1), sparse.n_dst))
    for g, want in ((und, "fused"), (dense, "atomic")):
        x, out, gout = _gat_rows(g, torch.bfloat16)
        att = torch.randn(2, 32)
        plan = gatv2_attention.plan_backward(g, x, x, att, None, out, gout, True)
        assert plan.variant == gatv2_attention.backward_mode(g, torch.bfloat16) == want
        assert plan.chunk == 256
        assert gatv2_attention.plan_backward(g, x, x, att, None, out, gout, False).variant == "atomic"
    # dot attention: the CSR forward (block kernels are for CUDA tensors), backward by the rule
    for g in (sparse, dense):
        for dtype in (torch.float32, torch.bfloat16):
            q = torch.randn(g.n_dst, 2, 16).to(dtype)
            k = torch.randn(g.n_src, 2, 16).to(dtype)
            out = torch.empty_like(q)
            fwd = dot_attention.plan_forward(g, q, k, k, None, 0.0, False, None, 0)
            assert fwd.variant == dot_attention.forward_algorithm(False) == "csr" and not fwd.block
            bwd = dot_attention.plan_backward(g, q, k, k, None, out, out, False, 0.0, 0)
            assert bwd.variant == dot_attention.backward_mode(g, False, dtype)
    # min/max: forward chunks, backward scatter, scatter order
    for g in (sparse, dense):
        x = torch.randn(g.n_src, 64)
        out = torch.empty(g.n_dst, 64)
        fwd = segment_reduce.plan_forward(g, x, None, True, out)
        assert int(fwd.variant) == segment_reduce.rule_chunks(g, x.dtype)
        state = torch.empty(segment_reduce.state_size(g.n_dst, 64), dtype=torch.int32)
        bwd = segment_reduce.plan_backward(g, x, None, "split", out, state, out, True, False)
        assert bwd.variant == segment_reduce.backward_mode(g, "split")
        assert bwd.max_chunks == segment_reduce.rule_chunks(g, x.dtype)
        if bwd.variant == "atomic":
            assert bwd.scatter == segment_reduce.scatter_order(g, 64, x.device) == "rows"
        first = segment_reduce.plan_backward(g, x, None, "first", out, state, out, True, False)
        assert first.variant == "atomic"
    # SpMM: the backward's route
    g = _graph()
    gout = torch.randn(g.n_dst, 8)
    assert spmm.plan_backward(g, gout, None, False).variant == "flag"  # its first step: no transpose built
    assert spmm.plan_backward(_outlive(_graph()), gout, None, False).variant == "transposed"
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "transposed")
    assert spmm.plan_backward(g, gout, None, False).variant == "transposed"
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "flag")
    assert spmm.plan_backward(g, gout, None, False).variant == "flag"
    assert spmm.plan_forward(g, gout, gout).variant == "searched"
    monkeypatch.setenv("GNN_FASTPATH_SPMM_ALG", "alg2")
    assert spmm.plan_forward(g, gout, gout).variant == "alg2"


def test_settings_reach_their_plans(monkeypatch):
    monkeypatch.setattr(segment_reduce.launch, "l2_bytes", lambda device: 1 << 40)  # no GPU here
    g = _outlive(_graph())
    x = torch.randn(g.n_src, 64)
    out = torch.empty(g.n_dst, 64)
    state = torch.empty(segment_reduce.state_size(g.n_dst, 64), dtype=torch.int32)
    monkeypatch.setenv("GNN_FASTPATH_SR_CHUNKS", "4")
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "transposed")
    monkeypatch.setenv("GNN_FASTPATH_SR_SCATTER", "slices")
    fwd = segment_reduce.plan_forward(g, x, None, True, out)
    assert (fwd.variant, fwd.decided_by) == ("4", "setting")
    bwd = segment_reduce.plan_backward(g, x, None, "split", out, state, out, True, False)
    assert (bwd.variant, bwd.decided_by, bwd.max_chunks, bwd.scatter) == ("transposed", "setting", 4, None)
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "atomic")
    bwd = segment_reduce.plan_backward(g, x, None, "split", out, state, out, True, False)
    assert (bwd.variant, bwd.scatter) == ("atomic", "slices")
    monkeypatch.setenv("GNN_FASTPATH_GATV2_CHUNK", "32")
    xs, o, go = _gat_rows(g)
    assert gatv2_attention.plan_forward(g, xs, xs, torch.randn(2, 32), None, o).chunk == 32
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", "atomic")
    q = torch.randn(g.n_dst, 2, 16)
    assert dot_attention.plan_backward(g, q, q, q, None, q, q, False, 0.0, 0).variant == "atomic"
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", "block")  # not offered here: the rule
    plan = dot_attention.plan_backward(g, q, q, q, None, q, q, False, 0.0, 0)
    assert plan.variant != "block" and plan.decided_by == "rule"


def test_tuner_settles_the_plan(monkeypatch, tmp_path):
    """With tuning on, a plan carries the tuner's pending choice; once the tuner's choice is
    final the cached plan is replaced by the settled one, which later calls get without
    asking the tuner."""
    from gnn_fastpath import tuning

    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tmp_path / "tuning.json"))
    monkeypatch.setattr(tuning, "FREE_MS", float("inf"))
    tuning.forget()
    times = {"atomic": 2.0, "transposed": 1.0}
    ran = []

    def timer(run, device, calls):
        return times[run()]

    monkeypatch.setattr(tuning, "_time_ms", timer)
    g = _graph()
    x, out, gout = _gat_rows(g)
    assert gat_attention.plan_backward(g, x, out, gout).tune is None  # a graph's first step: the rule
    _outlive(g)
    pending = gat_attention.plan_backward(g, x, out, gout)
    assert pending.tune is not None and pending.variant == "atomic"
    asked = []
    real = tuning.choice_on_graph
    monkeypatch.setattr(tuning, "choice_on_graph", lambda *a: asked.append(1) or real(*a))
    settled = plans.run(g, pending, torch.device("cpu"), lambda v: ran.append(v) or v)
    assert (settled.variant, settled.decided_by, settled.tune) == ("transposed", "tuner", None)
    again = gat_attention.plan_backward(g, x, out, gout)
    assert again is settled and plans.run(g, again, torch.device("cpu"), None) is settled
    assert len(asked) == 1 and set(ran) == {"atomic", "transposed"}
    report = gnn_fastpath.stats(plans=True, tuning=True)
    assert report["tuning"]["classes"]  # the tuner's own report as before
    tuning.forget()


def test_stats_view_lists_the_plans_that_ran():
    g = _graph()
    x, out, gout = _gat_rows(g)
    for _ in range(3):
        plans.run(g, gat_attention.plan_backward(g, x, out, gout))
    plans.run(g, gat_attention.plan_forward(g, x, out))
    view = gnn_fastpath.stats(plans=True)["plans"]
    entries = {e["pass"]: e for e in view["gat_attention"]}
    assert entries["backward"]["calls"] == 3 and entries["forward"]["calls"] == 1
    assert entries["backward"]["plan"]["variant"] == "atomic"
    assert entries["backward"]["plan"]["decided_by"] == "rule"
    assert entries["backward"]["key"] == gat_attention.plan_backward(g, x, out, gout).key
    assert "plans" not in gnn_fastpath.stats()
    gnn_fastpath.reset_stats()
    assert gnn_fastpath.stats(plans=True)["plans"] == {}


def test_launch_runs_the_plan(launches, monkeypatch):
    """Op -> launcher: the backward's launch follows the plan, and its plan is cached: a second
    step builds none."""
    from dry_launch import leaf
    from test_gat_attention_launchers_cpu import _apply

    g = _graph()
    built = dict(plans.build_counts)
    for _ in range(2):
        xs = torch.randn(g.n_src, 2, 32).requires_grad_()
        s, t = leaf(g.n_src, 2), leaf(g.n_dst, 2)
        _apply(g, xs, s, t, None, None, False, 0.0).sum().backward()
    assert plans.build_counts["gat_attention.backward"] == built.get("gat_attention.backward", 0) + 1
    assert plans.build_counts["gat_attention.forward"] == built.get("gat_attention.forward", 0) + 1
    assert "gat_bwd_dst" in launches
    view = plans.report()["gat_attention"]
    assert sum(e["calls"] for e in view if e["pass"] == "backward") == 2


def test_spmm_backward_route_follows_the_graph_through_its_steps(monkeypatch):
    """``auto``: cuSPARSE's transpose flag while a graph lives its first step, the cached
    transpose from the step after (a new plan: the graph's state is part of the key); a large
    graph, a multigraph and a static graph take the transpose at once."""
    g = _graph()
    gout = torch.randn(g.n_dst, 8)
    first = spmm.plan_backward(g, gout, None, False)
    assert (first.variant, first.decided_by) == ("flag", "rule")
    assert spmm.backward_route(g) == "flag"
    _outlive(g)
    second = spmm.plan_backward(g, gout, None, False)
    assert second is not first and (second.variant, second.decided_by) == ("transposed", "rule")
    for forced in ("block", "custom"):  # kernels that take no transposed product: the transpose, also in step one
        monkeypatch.setenv("GNN_FASTPATH_SPMM_ALG", forced)
        assert spmm.backward_route(_graph()) == "transposed"
        assert spmm.plan_backward(_graph(), gout, None, False).variant == "transposed"
    monkeypatch.setenv("GNN_FASTPATH_SPMM_ALG", "alg2")
    assert spmm.backward_route(_graph()) == "flag"
    monkeypatch.setattr(spmm, "FLAG_FIRST_STEP_MAX_EDGES", _graph().num_edges - 1)
    assert spmm.backward_route(_graph()) == "transposed"
    monkeypatch.undo()
    multi = Graph.from_edge_index(torch.tensor([[0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]), 1)
    assert multi.num_edges > multi.n_src * multi.n_dst and spmm.backward_route(multi) == "transposed"
    from gnn_fastpath.graph.tensors import as_graph, from_coo
    ei, nn = random_edges(30, 30, 90, seed=1)
    static = as_graph(from_coo(ei[0], ei[1], *nn))
    assert static.static and spmm.backward_route(static) == "transposed"
