"""The tuner on the GPU: real timings of the attention backwards' variants (GATv2's on an
undirected graph, with its one-pass variant), the min/max
forward's chunks and the SpMM algorithm search, the choice kept in the file and read (not
timed again) by a second process; tuned gradients equal the untuned ones (every variant is
exact, or for SpMM equal within float tolerance). The budget on the GPU: a class probes,
waits (its calls run the rule's variant, nothing more timed) until its allowance covers the
race, then races once; stats(tuning=True) reports it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnn_fastpath import Graph, tuning
from gnn_fastpath.cuda import cusparse
from gnn_fastpath.ops import dot_attention, gat_attention, gatv2_attention, segment_reduce, spmm
from zoo import random_edges

pytestmark = pytest.mark.cuda

H, D = 2, 32


def _graph(family=None):
    """Directed with a super node; for GATv2 the same edges both ways (undirected)."""
    edge_index, sizes = random_edges(3000, 3000, 60000, seed=21, empty_rows=5, super_node_degree=20000)
    if family == "gatv2":
        edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
    return Graph.from_edge_index(edge_index.cuda(), sizes)


#: Training steps a family's choice needs: min/max and the attention backwards choose on a graph
#: that outlived one.
STEPS = {"sr": 2, "gatv2": 2, "gat": 2, "dot": 2}


def _grads(family, graph, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).requires_grad_(True)

    if family == "dot":
        ins = [leaf(graph.n_dst, H, D), leaf(graph.n_src, H, D), leaf(graph.n_src, H, D)]
        out = dot_attention(graph, *ins)
    elif family == "sr":
        ins = [leaf(graph.n_src, 256)]
        out = segment_reduce(graph, *ins, "max")
    elif family == "spmm":
        ins = [leaf(graph.n_src, 256)]
        out = spmm(graph, *ins, norm="both")
    elif family == "gatv2":
        ins = [leaf(graph.n_src, H, D), leaf(graph.n_dst, H, D), leaf(H, D)]
        out = gatv2_attention(graph, *ins)
    else:
        ins = [leaf(graph.n_src, H, D), leaf(graph.n_src, H), leaf(graph.n_dst, H)]
        out = gat_attention(graph, *ins)
    out.backward(torch.randn(out.shape, device="cuda", generator=gen))
    return [t.grad for t in ins]


# a second process: the same call with tuning on reads the file and times nothing
_SECOND = """
import sys, torch
sys.path[:0] = [{tests!r}, {root!r}]
from gnn_fastpath import tuning
def no_timing(*args, **kwargs):
    raise AssertionError("timed again in a new process")
tuning._time_ms = no_timing
from gnn_fastpath.cuda import cusparse
cusparse.CsrMatrix._search = no_timing
from test_tuning_kernels import STEPS, _graph, _grads
graph = _graph({family!r})
for _ in range(STEPS.get({family!r}, 1)):
    _grads({family!r}, graph)
print("choices", len(tuning.listing()))
"""


#: family -> {decision of a class: the variants timed}, one class per decision
DECISIONS = {"dot": {"dot_attention.backward": {"atomic", "transposed"}},
             "gat": {"gat_attention.backward": {"atomic", "transposed"}},
             "gatv2": {"gatv2_attention.backward|undirected": {"atomic", "transposed", "fused"}},
             "sr": {"segment_reduce.forward": {"1", "2", "4"},
                    "segment_reduce.backward": {"atomic", "transposed"}},
             # float32: cuSPARSE's two timed algorithms and the own kernel (the block kernel
             # takes 16-bit products only); A and its explicit transpose share one signature
             "spmm": {"spmm.algorithm|plain": {"default", "alg2", "custom"}}}


@pytest.mark.parametrize("family", list(DECISIONS))
def test_tuned_variants_on_the_gpu(monkeypatch, tmp_path, family, gpu_memory_lock):
    """dot/GAT/GATv2 attention's backward variants, the min/max forward's feature chunks and its
    backward scatter, and the SpMM algorithm."""
    path = tmp_path / "tuning.json"
    graph = _graph(family)
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    want = _grads(family, graph)
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(path))
    monkeypatch.setattr(tuning, "FREE_MS", float("inf"))  # every race at its class's first call
    tuning.forget()
    cusparse.clear_shared_choices()  # the SpMM search of an earlier matrix of this signature
    fresh = _graph(family)  # a fresh graph: the first one's matrix keeps its algorithm
    for _ in range(STEPS.get(family, 1)):
        got = _grads(family, fresh)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    rows = tuning.listing()
    decisions = DECISIONS[family]
    assert len(rows) == len(decisions)
    for record in rows:
        variants = [v for d, v in decisions.items() if record["class"].startswith(d)]
        assert len(variants) == 1, record["class"]
        assert set(record["times_ms"]) == variants[0]
        times = record["times_ms"]
        assert all(t > 0 for t in times.values())
        rounds = record.get("rounds") or dict.fromkeys(times, 1)  # the SpMM search keeps no rounds
        finalists = [v for v, n in rounds.items() if n == max(rounds.values())]
        fastest = min(finalists, key=times.get)
        # the fastest of the variants that stayed in the race to its end (one that left early
        # has a median of fewer, earlier samples), or the rule's pick within the tie margin (never for the SpMM search)
        assert record["choice"] == fastest or (
            record["choice"] == record["default"] and times[record["default"]] <= (1 + tuning.TIE) * times[fastest]
            and not record["class"].startswith("spmm"))
        assert record["trials"] > 0 and record["cost_ms"] > 0
        assert torch.cuda.get_device_name() in record["device"]
    before = path.read_text()

    env = dict(os.environ, GNN_FASTPATH_TUNE="1", GNN_FASTPATH_TUNE_CACHE=str(path))
    here = Path(__file__).parent
    code = _SECOND.format(tests=str(here), root=str(here.parent), family=family)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"choices {len(decisions)}" in proc.stdout
    assert path.read_text() == before  # nothing measured or written again
    # another GPU model or version: the entry is not used there (a fresh timing would be)
    data = json.loads(before)
    assert list(data["entries"]) == [tuning.device_key(torch.device("cuda"))]


def test_a_large_race_waits_for_its_allowance(monkeypatch, tmp_path):
    """No free allowance, a share of 1: the first backward probes the rule's variant (two
    extra calls), the next calls run the rule's variant with nothing more timed while the
    allowance (calls x t_rule, less the probe) is below the race's estimate, then one call
    races; stats(tuning=True) reports each stage, and the gradients stay those of the rule."""
    import gnn_fastpath
    from gnn_fastpath.cuda import dot_attention as dot_kernels

    graph = _graph("dot")
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    want = _grads("dot", graph)  # compiles the rule's variant and builds what it needs (a short probe)
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tmp_path / "tuning.json"))
    monkeypatch.setattr(tuning, "FREE_MS", 0.0)
    monkeypatch.setattr(tuning, "SHARE", 1.0)
    tuning.forget()
    gnn_fastpath.reset_stats()
    rule = dot_kernels.backward_mode(graph, False, torch.float32)

    def entry():
        (e,) = [e for e in gnn_fastpath.stats(tuning=True)["tuning"]["classes"].values()
                if e["op"] == "dot_attention.backward"]
        return e

    _grads("dot", graph)
    first = entry()
    assert first["state"] == tuning.WAITING and first["trials"] == 2 and first["calls"] == 1
    assert first["default"] == rule and first["t_rule_ms"] > 0 and first["allowance_ms"] < first["race_estimate_ms"]
    calls = 1
    while entry()["state"] == tuning.WAITING:
        before = entry()
        assert before["trials"] == 2  # waiting costs nothing
        got = _grads("dot", graph)
        calls += 1
        assert calls < 1000
        if entry()["state"] == tuning.WAITING:  # the rule's variant ran
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    done = entry()
    assert done["state"] == tuning.MEASURED and done["trials"] > 2 and done["calls"] == calls
    # it raced at the first call whose allowance covered the estimate, not before
    assert before["allowance_ms"] + before["t_rule_ms"] >= before["race_estimate_ms"]
    assert before["allowance_ms"] < before["race_estimate_ms"]
    report = gnn_fastpath.stats(tuning=True)["tuning"]
    assert report["ms"] == pytest.approx(done["ms"], rel=1e-3) and report["trials"] == done["trials"]
    assert [r["class"].split("|")[0] for r in tuning.listing()] == ["dot_attention.backward"]
    tuning.forget()
