"""CPU smoke tests of benchmarks/bench_train.py: every code path of the training benchmark on a
tiny graph (stock vs ``enable(cpu="reference")``, fp32 and bf16 autocast), the config order,
the target verdicts, OOM handling and the time budget. Timings mean nothing here."""
import json
import math
import os
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import bench_train as BT  # noqa: E402
from benchmarks.timing import OOM  # noqa: E402

TINY = ["--device", "cpu", "--graphs", "arxiv-like", "--scale", "0.002", "--hidden", "4", "--heads", "2",
        "--warmup", "1", "--steps", "1"]


@pytest.fixture(autouse=True)
def _bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_BENCH_CACHE", str(tmp_path / "cache"))


def _run(tmp_path, *extra):
    pytest.importorskip("torch_geometric")
    js, md = tmp_path / "train.json", tmp_path / "train.md"
    assert BT.main(TINY + ["--json", str(js), "--markdown", str(md)] + list(extra)) == 0
    return json.loads(js.read_text()), md.read_text()


def test_smoke_every_layer_fp32_and_bf16(tmp_path):
    payload, md = _run(tmp_path, "--dtypes", "float32,bfloat16", "--num-layers", "1")
    rows = payload["rows"]
    assert payload["benchmark"] == "train"
    assert {(r["layer_key"], r["dtype"], r["mode"]) for r in rows} == {
        (l, d, m) for l in BT.LAYERS for d in ("float32", "bfloat16") for m in BT.MODES}
    assert payload["environment"]["torch"] == torch.__version__
    assert "git_commit" in payload["environment"]
    for r in rows:
        assert r["graph"] == "arxiv-like" and r["status"], r
        if r["mode"] == "stock" or r["dtype"] == "float32":
            # stock PyG and the fp32 fused path (reference ops on the CPU) must train here
            assert r["status"] == "ok", r
            assert isinstance(r["step_ms"], float) and len(r["step_ms_all"]) == 1
            assert len(r["losses"]) == 1 and r["finite_losses"], r
        if r["mode"] == "enabled":
            assert {"fused_cuda", "fused_reference", "fallback"} <= set(r), r
    fp32_enabled = [r for r in rows if r["mode"] == "enabled" and r["dtype"] == "float32"]
    assert all(r["fused_reference"] > 0 and not r["fallback"] for r in fp32_enabled), fp32_enabled
    # the markdown: targets table and one row per (graph, layer) with both dtypes
    assert "target (issue 10)" in md and "bf16 / fp32 enabled" in md
    for label in BT.LAYER_LABELS.values():
        assert label in md
    assert len(payload["targets"]) == len(BT.TARGETS)


def test_same_weights_same_losses_without_dropout(tmp_path):
    payload, _ = _run(tmp_path, "--dtypes", "float32", "--layers", "gatv2,gcn", "--attn-dropout", "0",
                      "--feat-dropout", "0", "--num-layers", "1", "--steps", "2")
    by = {(r["layer_key"], r["mode"]): r for r in payload["rows"]}
    for layer in ("gatv2", "gcn"):
        stock, fused = by[(layer, "stock")]["losses"], by[(layer, "enabled")]["losses"]
        assert len(stock) == len(fused) == 2
        for a, b in zip(stock, fused):
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), (layer, stock, fused)


def test_plan_measures_targets_first():
    order = BT.plan(BT.GRAPHS, BT.LAYERS, ["float32", "bfloat16"])
    assert len(order) == len(set(order)) == 3 * 4 * 2 * 2
    first = [c for t in BT.TARGETS for c in t.configs()]
    assert order[:len(first)] == first
    assert order[0] == ("tolokers", "gatv2", "bfloat16", "enabled")
    # a selection without the targets' graphs still covers every config
    order = BT.plan(["arxiv-like"], ["gcn"], ["float32"])
    assert order == [("arxiv-like", "gcn", "float32", "stock"), ("arxiv-like", "gcn", "float32", "enabled")]


def _row(graph, layer, dtype, mode, step):
    return {"graph": graph, "layer_key": layer, "dtype": dtype, "mode": mode,
            "step_ms": step, "status": step if isinstance(step, str) else "ok"}


def test_target_verdicts():
    rows = [_row("tolokers", "gatv2", "bfloat16", "stock", 50.0), _row("tolokers", "gatv2", "bfloat16", "enabled", 5.0),
            _row("arxiv-like", "transformer", "bfloat16", "stock", 50.0),
            _row("arxiv-like", "transformer", "bfloat16", "enabled", 20.0),
            _row("pokec-like", "sage_max", "bfloat16", "stock", OOM),
            _row("pokec-like", "sage_max", "bfloat16", "enabled", 30.0),
            _row("pokec-like", "gatv2", "bfloat16", "enabled", 60.0), _row("pokec-like", "gatv2", "float32", "enabled", 150.0),
            _row("pokec-like", "transformer", "bfloat16", "enabled", OOM)]
    res = {(t["graph"], t["layer"]): t for t in BT.evaluate_targets(rows)}
    assert res[("tolokers", "gatv2")]["verdict"] == "met" and res[("tolokers", "gatv2")]["value"] == 10.0
    assert res[("arxiv-like", "transformer")]["verdict"] == "missed"
    assert res[("pokec-like", "sage_max")]["verdict"].startswith("met (stock out of memory)")
    assert res[("pokec-like", "gatv2")]["verdict"] == "met" and res[("pokec-like", "gatv2")]["value"] == 0.4
    t = res[("pokec-like", "transformer")]
    assert t["verdict"].startswith("not measured") and "OOM" in t["verdict"] and "config not run" in t["verdict"]
    table = BT.targets_table(BT.evaluate_targets(rows))
    assert "10.00x" in table and "missed" in table


class _Oom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x, edge_index):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40 GiB")


class _Broken(_Oom):
    def forward(self, x, edge_index):
        raise RuntimeError("something else")


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x, edge_index):
        return self.lin(x)


def test_oom_is_a_result_and_errors_are_reported():
    data = BT.Data("g", torch.zeros(2, 0, dtype=torch.long), torch.randn(4, 3), torch.zeros(4, dtype=torch.long),
                   4, {"classes": 2})
    cpu = torch.device("cpu")
    res = BT.run_config(_Oom, data, "float32", "stock", cpu, warmup=1, steps=2)
    assert res["step_ms"] == OOM and res["status"] == OOM
    res = BT.run_config(_Broken, data, "bfloat16", "stock", cpu, warmup=1, steps=2)
    assert res["step_ms"] == "error" and res["status"].startswith("error: RuntimeError: something else")
    # the next config runs as if nothing happened
    res = BT.run_config(_Tiny, data, "bfloat16", "stock", cpu, warmup=1, steps=2)
    assert res["status"] == "ok" and len(res["losses"]) == 2 and res["finite_losses"]


def test_time_budget_writes_what_was_measured(tmp_path):
    payload, md = _run(tmp_path, "--time-budget", "0", "--layers", "gcn")
    assert [r["status"] for r in payload["rows"]] == ["skipped: time budget"] * 4
    assert "not measured" in md
    assert payload["settings"]["time_budget_s"] == 0


def test_report_summary_reads_train_json(tmp_path):
    from benchmarks import report

    payload, _ = _run(tmp_path, "--time-budget", "0", "--layers", "sage_max", "--dtypes", "bf16")
    text = report.summarize([str(tmp_path / "train.json")])
    assert "training steps" in text and "SAGEConv(max) x3" in text
