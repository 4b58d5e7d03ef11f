"""The training benchmarks as commands on the CPU (stock vs ``enable(cpu="reference")`` on tiny
graphs; timings mean nothing): each writes its JSON and markdown, the JSON has the fields the
tables, plots and RESULTS.md are made from, a run cut by its time budget still writes what it
has, a hung config leaves a stack, and stock and enabled start from the same weights."""
import importlib.util
import json
import math
import os
import statistics

import pytest

pytest.importorskip("torch_geometric")

TINY = ["--device", "cpu", "--scale", "0.002", "--hidden", "4", "--heads", "2", "--warmup", "1", "--steps", "1"]
SAMPLED = TINY + ["--graphs", "arxiv-like", "--whole-steps", "1", "--batch-sizes", "32", "--workers", "0",
                  "--dtypes", "float32"]
LAYERS = ["gatv2", "transformer", "gat", "gcn", "sage_max"]
ROW_KEYS = {"graph", "layer_key", "layer", "dtype", "mode", "status", "step_ms", "step_ms_all", "peak_mb",
            "finite_losses", "nodes", "edges"}


def _real_pyg_sampler():
    """pyg_lib or torch_sparse is installed (PyG's NeighborLoader samples with it)."""
    return bool(importlib.util.find_spec("pyg_lib") or importlib.util.find_spec("torch_sparse"))


def _pyg_sampler_reason():
    """None when PyG's NeighborLoader can sample here: with pyg_lib or torch_sparse, or else with
    the tests' pure-torch sampler (tests/pyg_sampler_shim.py; the session carries it into the
    tools' processes)."""
    from frameworks import pyg_neighbor_sampler

    if _real_pyg_sampler() or pyg_neighbor_sampler():
        return None
    return "PyG NeighborLoader cannot sample here: needs torch_sparse or pyg_lib"


def _dgl_or_skip():
    from frameworks import import_dgl

    if import_dgl() is None:
        pytest.skip("DGL does not import here")


def test_train_full_every_layer_same_weights(tool, result, tmp_path):
    """Every layer in fp32 and bf16; without dropout stock and enabled (same initial weights,
    reference ops) lose the same in fp32."""
    js, md = tmp_path / "full.json", tmp_path / "full.md"
    tool("bench_train_full", *TINY, "--graphs", "arxiv-like", "--dtypes", "float32,bfloat16", "--num-layers", "1",
         "--steps", "2", "--attn-dropout", "0", "--feat-dropout", "0", "--json", js, "--markdown", md)
    payload = result(js, "train_full")
    rows = payload["rows"]
    assert {(r["layer_key"], r["dtype"], r["mode"]) for r in rows} == {
        (l, d, m) for l in LAYERS for d in ("float32", "bfloat16") for m in ("stock", "enabled")}
    for r in rows:
        assert ROW_KEYS <= set(r), r
        if r["mode"] == "stock" or r["dtype"] == "float32":
            assert r["status"] == "ok" and isinstance(r["step_ms"], float) and len(r["step_ms_all"]) == 2, r
            assert len(r["losses"]) == 2 and r["finite_losses"], r
        if r["mode"] == "enabled":
            assert {"fused_cuda", "fused_reference", "fallback"} <= set(r), r
            if r["dtype"] == "float32":  # every conv call went through the shims, none fell back
                assert r["fused_reference"] > 0 and not r["fallback"], r
    by = {(r["layer_key"], r["dtype"], r["mode"]): r for r in rows}
    for layer in LAYERS:
        stock, fused = by[(layer, "float32", "stock")]["losses"], by[(layer, "float32", "enabled")]["losses"]
        for a, b in zip(stock, fused):
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), (layer, stock, fused)
    st = payload["settings"]
    assert st["modes"] == ["full"] and st["graphs"] == ["arxiv-like"] and st["dtypes"] == ["float32", "bfloat16"]
    assert [t["verdict"][:3] in ("met", "mis", "not") for t in payload["targets"]] == [True] * 5
    text = md.read_text()
    assert "target (issue 10)" in text and "bf16 / fp32 enabled" in text and "SAGEConv(max) x3" in text


def test_train_full_time_budget_and_summary(tool, result, tmp_path):
    """A run past its budget still writes every config (skipped) and the verdicts; the report's
    summary reads the file."""
    js = tmp_path / "full.json"
    tool("bench_train_full", *TINY, "--graphs", "arxiv-like", "--layers", "gcn", "--time-budget", "0",
         "--json", js, "--markdown", "")
    payload = result(js, "train_full")
    assert [r["status"] for r in payload["rows"]] == ["skipped: time budget"] * 4
    assert payload["settings"]["time_budget_s"] == 0
    assert all(t["verdict"].startswith("not measured") for t in payload["targets"])
    out = tool("report", "summary", js).stdout
    assert "train_full" in out and "target (issue 10)" not in out and "not measured" in out


def test_hung_config_leaves_a_stack(tool, tmp_path):
    """--config-timeout: a config that takes too long prints every thread's stack and ends the
    process; the JSON names the config that was running."""
    import json

    js = tmp_path / "full.json"
    proc = tool("bench_train_full", *TINY, "--graphs", "arxiv-like", "--layers", "gcn", "--dtypes", "float32",
                "--config-timeout", "0.001", "--json", js, "--markdown", "", expect=1)
    # the stack is the thread's at the moment of the timeout: inside a generator expression
    # faulthandler prints that frame alone, so the frames below it are not asserted
    assert "Timeout" in proc.stderr and "Thread 0x" in proc.stderr and '  File "' in proc.stderr
    assert json.loads(js.read_text())["settings"]["running"][:2] == ["arxiv-like", "gcn"]


def _check_sampled_rows(rows, sampler, layers, whole=True):
    assert {(r["layer_key"], r["mode"]) for r in rows} == {(l, m) for l in layers for m in ("stock", "enabled")}
    for r in rows:
        assert r["sampler"] == sampler and r["batch_size"] == 32 and r["graph"] == "arxiv-like", r
        assert r["status"] == "ok" and isinstance(r["step_ms"], float) and r["finite_losses"], r
        assert isinstance(r["host_ms"], float) and r["batch_nodes"] >= 32 and r["batch_edges"] > 0, r
        if whole:
            assert r["whole_status"] == "ok" and isinstance(r["whole_ms"], float), r
            assert isinstance(r["loader_ms"], float) and r["bound"] in ("sampler", "model"), r
        if r["mode"] == "enabled":
            assert r["fused_reference"] > 0 and not r["fallback"], r


def test_train_sampled_dgl_with_phases(tool, result, tmp_path):
    _dgl_or_skip()
    js, md = tmp_path / "s.json", tmp_path / "s.md"
    tool("bench_train_sampled", *SAMPLED, "--samplers", "dgl", "--layers", "gatv2,transformer,sage_max",
         "--profile-phases", "all", "--profile-steps", "1", "--json", js, "--markdown", md)
    payload = result(js, "train_sampled")
    _check_sampled_rows(payload["rows"], "dgl", ["gatv2", "sage_max"])  # DGL has no TransformerConv
    for r in payload["rows"]:
        ph = r["phases"]
        assert ph["n"] == 1 and set(ph["build_ms"]) == {"fwd", "bwd", "opt", "total"}
        assert all(isinstance(ph[p][k], float) for p in ("cold", "warm") for k in ("fwd_ms", "bwd_ms", "total_ms"))
    st = payload["settings"]
    assert st["modes"] == ["sampled"] and st["sampled"]["fanouts"] == [15, 10, 5]
    assert st["sampled"]["sampler_status"] == {"dgl": "ok"}
    [loader] = payload["loaders"]
    assert loader["status"] == "ok" and loader["sampler"] == "dgl" and isinstance(loader["loader_ms"], float)
    assert len(payload["sampled_targets"]) == 6
    text = md.read_text()
    assert "target (sampled training)" in text and "Per-phase breakdown" in text and "DGL GATv2Conv x3" in text


def test_train_sampled_pyg_padded(tool, result, tmp_path):
    reason = _pyg_sampler_reason()
    if reason:
        pytest.skip(reason)
    js = tmp_path / "s.json"
    tool("bench_train_sampled", *SAMPLED, "--samplers", "pyg", "--layers", "gcn,sage_max", "--workers", "1",
         "--pad-batches", "--json", js, "--markdown", "")
    payload = result(js, "train_sampled")
    _check_sampled_rows(payload["rows"], "pyg", ["gcn", "sage_max"])
    [loader] = payload["loaders"]
    assert loader["workers"] == 1 and loader["padded"] and loader["padded_nodes"] > loader["batch_nodes_max"]
    assert loader["pad_check"] < 1e-9  # padding leaves the seeds' outputs alone
    assert all(r["padded"] for r in payload["rows"])


def test_train_sampled_rounds_flip_the_order(tool, result, tmp_path):
    """``--rounds 3``: each stock/enabled pair runs three times, the first mode of the pair
    flipping every round; the rows are the medians of the rounds, the raw rows are kept."""
    reason = _pyg_sampler_reason()
    if reason:
        pytest.skip(reason)
    js = tmp_path / "s.json"
    tool("bench_train_sampled", *SAMPLED, "--samplers", "pyg", "--layers", "gcn", "--no-whole", "--rounds", "3",
         "--json", js, "--markdown", "")
    payload = result(js, "train_sampled")
    raw = payload["round_rows"]
    first, second = raw[0]["mode"], raw[1]["mode"]
    assert {first, second} == {"stock", "enabled"}
    assert [(r["mode"], r["round"]) for r in raw] == [
        (first, 1), (second, 1), (second, 2), (first, 2), (first, 3), (second, 3)]
    assert payload["settings"]["rounds"] == 3
    _check_sampled_rows(payload["rows"], "pyg", ["gcn"], whole=False)
    for r in payload["rows"]:
        mine = [x["step_ms"] for x in raw if x["mode"] == r["mode"]]
        assert r["rounds"] == 3 and r["step_ms_rounds"] == mine and r["step_ms"] == sorted(mine)[1], r
    [target] = [t for t in payload["sampled_targets"] if t["layer"] == "gcn" and t["batch_size"] == 32] or [None]
    stock, enabled = ({r["mode"]: r for r in payload["rows"]}[m]["step_ms"] for m in ("stock", "enabled"))
    assert target is None or target["value"] == pytest.approx(stock / enabled)


def test_train_sampled_paired_steps_alternate(tool, result, tmp_path):
    """``--paired``: one run per config in which the stock and the enabled model take turns on
    the same batches, in blocks; a stock and an enabled row (each its own steps' median) carrying the same
    pair statistics, and the markdown's paired table; ``--rounds`` does not combine with it."""
    reason = _pyg_sampler_reason()
    if reason:
        pytest.skip(reason)
    js, md = tmp_path / "s.json", tmp_path / "s.md"
    tool("bench_train_sampled", *SAMPLED, "--steps", "3", "--samplers", "pyg", "--layers", "gcn,gatv2", "--paired",
         "--json", js, "--markdown", md)
    payload = result(js, "train_sampled")
    assert payload["settings"]["paired"] is True
    _check_sampled_rows(payload["rows"], "pyg", ["gcn", "gatv2"], whole=False)
    steps = payload["settings"]["steps"]
    for layer in ("gcn", "gatv2"):
        mine = {r["mode"]: r for r in payload["rows"] if r["layer_key"] == layer}
        stock, enabled = mine["stock"], mine["enabled"]
        assert stock["paired"] == enabled["paired"]
        pair = enabled["paired"]
        assert steps == len(stock["step_ms_all"]) == len(enabled["step_ms_all"])
        block = pair["block"]
        assert pair["pairs"] == -(-steps // block)
        cuts = range(0, steps, block)
        ratios = [statistics.median(stock["step_ms_all"][i:i + block])
                  / statistics.median(enabled["step_ms_all"][i:i + block]) for i in cuts]
        assert pair["paired_x"] == pytest.approx(statistics.median(ratios), rel=1e-3)
        assert pair["paired_enabled_slower"] == sum(r < 1.0 for r in ratios) / len(ratios)
        assert stock["whole_status"].startswith("skipped: paired")
    assert "Paired steps (--paired)" in md.read_text()
    proc = tool("bench_train_sampled", *SAMPLED, "--samplers", "pyg", "--layers", "gcn", "--paired", "--rounds", "2",
                "--json", tmp_path / "x.json", "--markdown", "", expect=1)
    assert "--rounds does not apply" in proc.stderr


def test_train_sampled_paired_control_runs_stock_on_both_sides(tool, result, tmp_path):
    """``--paired --paired-control``: the same schedule with the enabled side's blocks stock
    too (an A/A control): no patched call on either side, ``control`` in the pair statistics
    and the markdown; the option needs ``--paired``."""
    reason = _pyg_sampler_reason()
    if reason:
        pytest.skip(reason)
    js, md = tmp_path / "c.json", tmp_path / "c.md"
    tool("bench_train_sampled", *SAMPLED, "--steps", "3", "--samplers", "pyg", "--layers", "gcn", "--paired",
         "--paired-control", "--json", js, "--markdown", md)
    payload = result(js, "train_sampled")
    assert payload["settings"]["paired_control"] is True
    enabled = next(r for r in payload["rows"] if r["mode"] == "enabled")
    assert enabled["paired"]["control"] is True and enabled["paired"]["pairs"] >= 1
    assert not any(enabled.get(k) for k in ("fused_cuda", "fused_reference")) and not enabled.get("fallback")
    assert "control: both sides stock" in md.read_text()
    proc = tool("bench_train_sampled", *SAMPLED, "--samplers", "pyg", "--layers", "gcn", "--paired-control",
                "--json", tmp_path / "y.json", "--markdown", "", expect=1)
    assert "--paired-control is a control for --paired" in proc.stderr


def test_train_sampled_pyg_without_a_sampling_library(request, monkeypatch, tmp_path):
    """Without torch_sparse or pyg_lib the PyG rows are reported as skipped, not a crash (the
    tool runs without the tests' pure-torch sampler)."""
    if _real_pyg_sampler():
        pytest.skip("PyG can sample here")
    monkeypatch.setenv("GNN_FASTPATH_TEST_SAMPLER_SHIM", "0")  # read by tests/_sampler_site in the tool's process
    tool, result = request.getfixturevalue("tool"), request.getfixturevalue("result")
    js = tmp_path / "s.json"
    tool("bench_train_sampled", *SAMPLED, "--samplers", "pyg", "--layers", "gatv2,gcn", "--json", js, "--markdown", "")
    payload = result(js, "train_sampled")
    assert [r["status"] for r in payload["rows"]] == ["skipped: needs torch_sparse or pyg_lib"] * 4
    assert payload["loaders"] == []
    assert all(t["verdict"].startswith("not measured") for t in payload["sampled_targets"])


def test_compile_full_batch(tool, result, tmp_path):
    """Compiled rows beside the eager ones with their compile fields, and the comparisons
    (aot_eager: the tracing path without inductor's slow CPU compile)."""
    js, md = tmp_path / "c.json", tmp_path / "c.md"
    tool("bench_compile", *TINY, "--mode", "full", "--graphs", "arxiv-like", "--layers", "sage_max", "--dtypes",
         "float32", "--num-layers", "1", "--steps", "2", "--compile", "none,default", "--compile-backend", "aot_eager",
         "--compile-warmup", "2", "--json", js, "--markdown", md)
    payload = result(js, "compile")
    rows = payload["rows"]
    assert [(r["mode"], r.get("compile")) for r in rows] == [
        ("stock", None), ("enabled", None), ("enabled", "default"), ("stock", "default")]
    for r in rows:
        assert r["status"] == "ok" and isinstance(r["step_ms"], float) and r["finite_losses"], r
        if r.get("compile"):
            assert r["compile_backend"] == "aot_eager" and r["compile_warmup"] == 2
            assert isinstance(r["compile_s"], float) and r["graph_breaks"] == 0 and r["recompiles"] == 0, r
            assert isinstance(r["x_vs_eager"], float)
            if r["mode"] == "enabled":  # the enabled model traced the fused path onto the custom operators
                assert r["compiled_calls"] == {"reference": 1} and isinstance(r["x_vs_compiled_stock"], float), r
        else:
            assert "compile_s" not in r
    [c] = payload["compiled"]
    assert (c["kind"], c["compile"], c["bound"]) == ("full", "default", 1.0) and c["verdict"] in ("met", "missed")
    assert payload["settings"]["compile"]["modes"] == ["default"]
    assert "torch.compile: compiled stock / enabled vs eager" in md.read_text()


def test_paired_schedule_alternates_blocks_abba():
    """Equal timed steps per mode, block by block, the order flipping every block pair (read
    from the tool's module in a subprocess: the tools are never imported into the tests)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import json; from benchmarks.sampling import paired_schedule as p; "
            "print(json.dumps([p(10, 4), p(0, 4), p(40)]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(root), CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-2000:]
    ten, none, forty = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ten == [["stock", 4], ["enabled", 4], ["enabled", 4], ["stock", 4], ["stock", 2], ["enabled", 2]]
    assert none == []
    assert all(sum(n for m, n in forty if m == mode) == 40 for mode in ("stock", "enabled"))
