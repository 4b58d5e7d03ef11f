"""The host-time benchmark as a command on the CPU (stock vs ``enable(cpu="reference")``; host
times there include the compute and no target is judged)."""
import pytest

pytest.importorskip("torch_geometric")

TINY = ["--device", "cpu", "--calls", "3", "--warmup", "1", "--nodes", "16", "--edges", "48", "--features", "4",
        "--heads", "2"]
PYG = ["pyg_gatv2", "pyg_transformer", "pyg_gcn", "pyg_sage_mean", "pyg_sage_max"]


def test_pyg_layers(tool, result, tmp_path):
    js, md = tmp_path / "host.json", tmp_path / "host.md"
    tool("bench_host", *TINY, "--layers", ",".join(PYG), "--json", js, "--markdown", md)
    payload = result(js, "host")
    rows = payload["rows"]
    assert {(r["layer"], r["mode"], r["pass"], r["graph"]) for r in rows} == {
        (l, m, p, g) for l in PYG for m in ("stock", "enabled") for p in ("fwd", "fwd_bwd") for g in ("same", "new")}
    for r in rows:
        assert r["status"] == "ok" and isinstance(r["host_us"], float) and r["calls"] == 3, r
        assert r["wall_us"] >= r["host_us"] and r["gpu_us"] is None
        if r["mode"] == "enabled":  # warm-up + timed calls, all on the shims, no fallback
            assert r["fused_reference"] == 4 and not r["fallback"], r
    assert [t["layer"] for t in payload["targets"]] == PYG
    assert all(t["verdict"] == "not measured (reference ops: a CPU smoke run)" for t in payload["targets"])
    text = md.read_text()
    assert "target (host time)" in text and "PyG SAGEConv(max)" in text and "new each call" in text


def test_dgl_layers_and_time_budget(tool, result, tmp_path):
    from frameworks import import_dgl

    js = tmp_path / "host.json"
    if import_dgl() is not None:
        tool("bench_host", *TINY, "--layers", "dgl_gatv2,dgl_graphconv,dgl_sage_pool", "--passes", "fwd_bwd",
             "--graphs", "new", "--json", js, "--markdown", "")
        payload = result(js, "host")
        assert len(payload["rows"]) == 6 and payload["targets"] == []
        for r in payload["rows"]:
            assert r["status"] == "ok", r
            if r["mode"] == "enabled":
                assert r["fused_reference"] == 4 and not r["fallback"], r
    tool("bench_host", *TINY, "--layers", "pyg_gcn", "--time-budget", "0", "--json", js, "--markdown", "")
    payload = result(js, "host")
    assert [r["status"] for r in payload["rows"]] == ["skipped: time budget"] * 8
    assert payload["targets"][0]["verdict"] == "not measured (skipped: time budget)"


def test_dry_run_times_the_fused_path_without_a_gpu(tool, result, tmp_path):
    """--device dry: CPU tensors on the fused path's CUDA decisions (launches skipped): the
    enabled calls are the fused path's (counted as CUDA calls), and no target is judged."""
    js, md = tmp_path / "host.json", tmp_path / "host.md"
    tool("bench_host", *[a if a != "cpu" else "dry" for a in TINY], "--repeats", "2", "--layers",
         "pyg_gatv2,pyg_sage_max", "--passes", "fwd", "--json", js, "--markdown", md)
    payload = result(js, "host")
    assert payload["settings"]["device"] == "dry"
    rows = payload["rows"]
    assert len(rows) == 8
    for r in rows:
        assert r["status"] == "ok" and r["device"] == "dry" and isinstance(r["host_us"], float), r
        assert r["repeats"] == 2, r
        if r["mode"] == "enabled":  # warm-up + 2 windows of timed calls, all fused on the CUDA route
            assert r["fused_cuda"] == 7 and not r.get("fused_reference") and not r["fallback"], r
    assert all(t["verdict"] == "not measured (dry run: CPU tensors, launches skipped)" for t in payload["targets"])
    text = md.read_text()
    assert "Dry run: CPU tensors" in text and "- (dry run)" in text and "the fastest of 2 such windows" in text


def test_measure_keeps_the_fastest_window_on_the_given_clock():
    """``measure`` times ``repeats`` windows on the clock it is given and keeps the fastest."""
    import torch
    from benchmarks.bench_host import measure, pool_size

    ticks = iter([0.0, 5.0, 5.0, 5.0, 6.0, 6.0, 6.0, 9.0, 9.0])  # windows of 5 s, 1 s, 3 s (start, end, synced)
    calls = []
    res = measure(calls.append, 4, 2, torch.device("cpu"), 0, clock=lambda: next(ticks), repeats=3)
    assert res["host_us"] == pytest.approx(1e6 / 4) and res["wall_us"] == pytest.approx(1e6 / 4)
    assert res["repeats"] == 3 and calls == list(range(2 + 4 * 3))
    assert pool_size(4, 2, 0, 3) == 2 + 4 * 3 + 1
