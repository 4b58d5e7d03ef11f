"""CPU smoke tests of benchmarks/bench_host.py (host time per layer call): every code path on
the CPU (stock vs ``enable(cpu="reference")``), the measurement order, the pool of new graphs,
the target verdicts and the table. Timings mean nothing here."""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import bench_host as BH  # noqa: E402

TINY = ["--device", "cpu", "--calls", "3", "--warmup", "1", "--nodes", "16", "--edges", "48", "--features", "4",
        "--heads", "2"]


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _run(tmp_path, *extra):
    js, md = tmp_path / "host.json", tmp_path / "host.md"
    assert BH.main(TINY + ["--json", str(js), "--markdown", str(md)] + list(extra)) == 0
    return json.loads(js.read_text()), md.read_text()


def test_smoke_pyg_layers(tmp_path, one_thread):
    pytest.importorskip("torch_geometric")
    layers = [l for l in BH.LAYERS if l.startswith("pyg_")]
    payload, md = _run(tmp_path, "--layers", ",".join(layers))
    rows = payload["rows"]
    assert payload["benchmark"] == "host" and payload["environment"]["torch"] == torch.__version__
    assert {(r["layer"], r["mode"], r["pass"], r["graph"]) for r in rows} == {
        (l, m, p, g) for l in layers for m in BH.MODES for p in BH.PASSES for g in BH.GRAPH_MODES}
    for r in rows:
        assert r["status"] == "ok", r
        assert isinstance(r["host_us"], float) and r["host_us"] > 0 and r["calls"] == 3, r
        assert r["wall_us"] >= r["host_us"] and r["gpu_us"] is None
        if r["mode"] == "enabled":
            # warm-up + timed calls, all on the shims (reference ops on the CPU), no fallback
            assert r["fused_reference"] == 4 and not r["fallback"], r
    targets = payload["targets"]
    assert [t["layer"] for t in targets] == layers
    assert all(t["verdict"] == "not measured (reference ops: a CPU smoke run)" for t in targets), targets
    assert "target (host time)" in md and "PyG SAGEConv(max)" in md and "new each call" in md
    assert "- (reference ops)" in md


def test_smoke_dgl_layers(tmp_path, one_thread):
    from benchmarks.bench_train import import_dgl

    if import_dgl() is None:
        pytest.skip("DGL does not import here")
    payload, md = _run(tmp_path, "--layers", "dgl_gatv2,dgl_graphconv,dgl_sage_pool", "--passes", "fwd_bwd",
                       "--graphs", "new")
    rows = payload["rows"]
    assert len(rows) == 6
    for r in rows:
        assert r["status"] == "ok", r
        if r["mode"] == "enabled":
            assert r["fused_reference"] == 4 and not r["fallback"], r
    assert payload["settings"]["dgl_graph_on"] == "device"  # the CPU is the device here
    assert payload["targets"] == []  # no forward-only same-graph measurement: no target row
    assert "DGL GATv2Conv" in md


def test_time_budget_and_missing_fastpath(tmp_path):
    pytest.importorskip("torch_geometric")
    payload, md = _run(tmp_path, "--layers", "pyg_gcn", "--time-budget", "0")
    assert [r["status"] for r in payload["rows"]] == ["skipped: time budget"] * 8
    assert payload["targets"][0]["verdict"] == "not measured (skipped: time budget)"
    assert "not measured" in md


def test_plan_targets_first():
    order = BH.plan(["pyg_gatv2", "dgl_gatv2"], BH.PASSES, BH.GRAPH_MODES)
    assert len(order) == len(set(order)) == 2 * 2 * 2 * 2
    assert order[:4] == [("pyg_gatv2", "enabled", "fwd", "same"), ("dgl_gatv2", "enabled", "fwd", "same"),
                         ("pyg_gatv2", "stock", "fwd", "same"), ("dgl_gatv2", "stock", "fwd", "same")]
    assert BH.plan(["pyg_gcn"], ["fwd_bwd"], ["new"]) == [("pyg_gcn", "stock", "fwd_bwd", "new"),
                                                          ("pyg_gcn", "enabled", "fwd_bwd", "new")]


def test_measure_uses_each_index_once():
    seen = []
    res = BH.measure(seen.append, n=5, warmup=2, device=torch.device("cpu"), gpu_calls=0)
    assert seen == list(range(7)) and res["calls"] == 5 and res["host_us"] > 0
    # the pool of new graphs covers warm-up, timed calls, the sync count and the GPU calls
    assert BH.pool_size(5, 2, 16) == 2 + 5 + 1 + 16


def test_new_graph_pool_objects_are_distinct():
    ei = BH.tiny_graph(8, 20, seed=1)
    g = BH.Graphs("pyg", ei, 8, torch.device("cpu"))
    pool = g.pool(4)
    assert len({id(t) for t in pool}) == 4 and all(torch.equal(t, ei) for t in pool)
    assert all(t is not ei for t in pool)


def _row(layer, mode, host, pas="fwd", graph="same", cuda=True, fallback=None, status="ok", gpu=None):
    r = {"layer": layer, "label": BH.LABELS[layer], "mode": mode, "pass": pas, "graph": graph, "status": status,
         "host_us": host, "gpu_us": gpu, "wall_us": host}
    if mode == "enabled":
        r.update(fused_cuda=100 if cuda else 0, fused_reference=0 if cuda else 100, fallback=fallback or {})
    return r


def test_target_verdicts_and_table():
    rows = [_row("pyg_gatv2", "enabled", 35.0, gpu=8.0), _row("pyg_gatv2", "stock", 300.0, gpu=20.0),
            _row("pyg_transformer", "enabled", 55.0),
            _row("pyg_gcn", "enabled", 30.0, fallback={"dtype": 100}),
            _row("pyg_sage_max", "enabled", None, status="error: RuntimeError: boom"),
            _row("dgl_gatv2", "enabled", 20.0, cuda=False),
            _row("pyg_gatv2", "enabled", 90.0, graph="new")]
    res = {t["layer"]: t for t in BH.evaluate_targets(rows)}
    assert res["pyg_gatv2"]["verdict"] == "met" and res["pyg_gatv2"]["value"] == 35.0
    assert res["pyg_transformer"]["verdict"] == "missed"
    assert res["pyg_gcn"]["verdict"] == "not measured (fell back: dtype)"
    assert res["pyg_sage_max"]["verdict"] == "not measured (error: RuntimeError: boom)"
    assert res["dgl_gatv2"]["verdict"].startswith("not measured (reference ops")
    table, cols, heads = BH.table_rows({"rows": rows})
    by = {(r["layer"], r["graph"]): r for r in table}
    g = by[("PyG GATv2Conv", "same")]
    assert g["x"] == "8.57x" and g["target"] == "met" and g["eg"] == "8.0" and g["sh"] == "300.0"
    assert by[("PyG TransformerConv", "same")]["target"] == "missed"
    assert by[("PyG GATv2Conv", "new each call")]["target"] == ""
    md = BH.markdown({"settings": {"nodes": 64, "edges": 256, "features": 16, "heads": 4, "calls": 1000,
                                   "warmup": 50, "gpu_calls": 16}, "rows": rows})
    assert "35.0 us" in md and "missed" in md and "64 nodes, 256 random edges" in md
