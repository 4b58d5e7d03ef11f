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
        "--warmup", "1", "--steps", "1", "--mode", "full"]


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


# ----------------------------------------------------------------------------- sampled mini-batches
SAMPLED = ["--device", "cpu", "--mode", "sampled", "--sampled-graphs", "arxiv-like", "--scale", "0.002",
           "--hidden", "4", "--heads", "2", "--warmup", "1", "--steps", "1", "--whole-steps", "1",
           "--batch-sizes", "32", "--workers", "0", "--dtypes", "float32"]


def _run_sampled(tmp_path, *extra):
    pytest.importorskip("torch_geometric")
    js, md = tmp_path / "sampled.json", tmp_path / "sampled.md"
    assert BT.main(SAMPLED + ["--json", str(js), "--markdown", str(md)] + list(extra)) == 0
    return json.loads(js.read_text()), md.read_text()


def _dgl_or_skip():
    if BT.import_dgl() is None:
        pytest.skip("DGL does not import here (tests/frameworks.py import_dgl returned None)")


def _pyg_sampler_or_skip():
    reason = BT.pyg_sampler_reason()
    if reason:
        pytest.skip(f"PyG NeighborLoader cannot sample here: {reason}")


@pytest.fixture
def one_thread():
    """One intra-op thread: the 2-core development machine is shared, and OpenMP spinning on
    a loaded machine makes tiny ops take milliseconds."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _check_sampled_rows(rows, sampler, layers):
    assert {(r["layer_key"], r["mode"]) for r in rows} == {(l, m) for l in layers for m in BT.MODES}
    for r in rows:
        assert r["sampler"] == sampler and r["batch_size"] == 32 and r["graph"] == "arxiv-like", r
        assert r["status"] == "ok", r
        assert isinstance(r["step_ms"], float) and len(r["step_ms_all"]) == 1 and r["finite_losses"], r
        assert isinstance(r["host_ms"], float)
        assert r["whole_status"] == "ok" and isinstance(r["whole_ms"], float), r
        assert isinstance(r["loader_ms"], float) and r["bound"] in ("sampler", "model"), r
        assert r["batch_nodes"] >= 32 and r["batch_edges"] > 0, r
        if r["mode"] == "enabled":
            # every conv call of the enabled model went through the shims (reference ops on the CPU)
            assert r["fused_reference"] > 0 and not r["fallback"], r


def test_sampled_smoke_dgl_sampler_with_phases(tmp_path, one_thread):
    _dgl_or_skip()
    payload, md = _run_sampled(tmp_path, "--samplers", "dgl", "--layers", "gatv2,transformer,sage_max",
                               "--profile-phases", "all", "--profile-steps", "1")
    rows = payload["rows"]
    # DGL has no TransformerConv: no rows for it
    _check_sampled_rows(rows, "dgl", ["gatv2", "sage_max"])
    assert all(r["layer"].startswith("DGL ") for r in rows)
    for r in rows:
        ph = r["phases"]
        assert ph["n"] == 1 and set(ph["build_ms"]) == {"fwd", "bwd", "opt", "total"}
        for k in ("fwd_ms", "bwd_ms", "opt_ms", "total_ms", "fwd_host_ms"):
            assert isinstance(ph["cold"][k], float) and isinstance(ph["warm"][k], float)
    assert payload["settings"]["modes"] == ["sampled"]
    assert payload["settings"]["sampled"]["fanouts"] == [15, 10, 5]
    [loader] = payload["loaders"]
    assert loader["status"] == "ok" and loader["sampler"] == "dgl" and isinstance(loader["loader_ms"], float)
    assert len(payload["sampled_targets"]) == len(BT.SAMPLED_TARGETS)
    assert "target (sampled training)" in md and "Per-phase breakdown" in md and "DGL GATv2Conv x3" in md
    assert "target (issue 10)" not in md  # no full-batch section in a sampled-only run


def test_sampled_dgl_cpu_build_rows(tmp_path, monkeypatch, one_thread):
    """With a GPU and DGL's CPU-only build, stock DGL cannot run (blocks on the CPU, features on
    the GPU): those rows say so and only enabled rows are timed."""
    _dgl_or_skip()
    monkeypatch.setattr(BT, "dgl_cuda_ok", lambda dgl, device: False)
    payload, md = _run_sampled(tmp_path, "--samplers", "dgl", "--layers", "gcn", "--no-whole")
    by = {r["mode"]: r for r in payload["rows"]}
    assert by["stock"]["status"] == BT.DGL_NOT_RUNNABLE and by["stock"].get("step_ms") is None
    assert by["enabled"]["status"] == "ok" and isinstance(by["enabled"]["step_ms"], float)
    assert "whole_ms" not in by["enabled"] and "loader_ms" not in payload["loaders"][0]
    assert payload["settings"]["sampled"]["dgl_blocks_on"] == "cpu"
    assert "not runnable (DGL CPU build)" in md


def test_sampled_smoke_pyg_sampler(tmp_path, one_thread):
    _pyg_sampler_or_skip()
    payload, md = _run_sampled(tmp_path, "--samplers", "pyg", "--profile-phases")
    _check_sampled_rows(payload["rows"], "pyg", BT.LAYERS)
    # a bare --profile-phases covers the targets' configs only (batch 1024 / 4096, not 32)
    assert payload["settings"]["sampled"]["profile_phases"] == "targets"
    assert not [r for r in payload["rows"] if "phases" in r]
    assert "GCNConv x3" in md and "loader alone ms" in md


def test_sampled_pyg_with_a_worker_process(tmp_path, one_thread):
    """The real loader as users run it: a persistent worker process."""
    _pyg_sampler_or_skip()
    payload, _ = _run_sampled(tmp_path, "--samplers", "pyg", "--layers", "gcn", "--workers", "1", "--steps", "2",
                              "--whole-steps", "2")
    for r in payload["rows"]:
        assert r["status"] == "ok" and r["whole_status"] == "ok" and r["workers"] == 1, r
    assert payload["loaders"][0]["workers"] == 1


def test_sampled_pyg_without_sampling_library(tmp_path, monkeypatch):
    """Without torch_sparse or pyg_lib the pyg rows are reported as skipped, not a crash."""
    monkeypatch.setattr(BT, "pyg_sampler_reason", lambda: BT.PYG_SAMPLER_MISSING)
    payload, md = _run_sampled(tmp_path, "--samplers", "pyg", "--layers", "gatv2,gcn")
    assert [r["status"] for r in payload["rows"]] == [BT.PYG_SAMPLER_MISSING] * 4
    assert payload["loaders"] == []
    assert "needs torch_sparse or pyg_lib" in md
    assert all(t["verdict"].startswith("not measured") for t in payload["sampled_targets"])


def test_both_modes_full_first(tmp_path, monkeypatch):
    monkeypatch.setattr(BT, "pyg_sampler_reason", lambda: BT.PYG_SAMPLER_MISSING)
    pytest.importorskip("torch_geometric")
    js, md = tmp_path / "both.json", tmp_path / "both.md"
    args = [a for a in SAMPLED if a not in ("--mode", "sampled")] + ["--graphs", "arxiv-like", "--layers", "gcn",
                                                                     "--samplers", "pyg", "--json", str(js),
                                                                     "--markdown", str(md)]
    assert BT.main(args) == 0
    payload = json.loads(js.read_text())
    assert payload["settings"]["modes"] == ["full", "sampled"]
    assert [BT.is_sampled(r) for r in payload["rows"]] == [False, False, True, True]
    assert len(payload["targets"]) == len(BT.TARGETS)
    text = md.read_text()
    assert text.index("target (issue 10)") < text.index("target (sampled training)")


def test_plan_sampled_targets_first_and_grouped():
    order = BT.plan_sampled(BT.SAMPLED_GRAPHS, BT.LAYERS, ["float32", "bfloat16"], BT.SAMPLERS, BT.BATCH_SIZES)
    assert len(order) == len(set(order))
    # DGL has no TransformerConv
    assert not [c for c in order if c[4] == "dgl" and c[1] == "transformer"]
    assert len(order) == 2 * 2 * 2 * 2 * (4 + 3)
    first = [c for t in BT.SAMPLED_TARGETS for c in t.configs()]
    assert order[:len(first)] == first
    assert order[0] == ("arxiv-like", "gatv2", "float32", "enabled", "pyg", 1024)
    # right after the targets: the rest of the last target group (pokec-like, pyg, 4096)
    c = order[len(first)]
    assert (c[0], c[4], c[5]) == ("pokec-like", "pyg", 4096)
    # the pyg groups of the targets' (graph, batch) cases come before DGL's, then the rest
    tiers = [0 if (c[0], c[5]) in {("arxiv-like", 1024), ("pokec-like", 4096)} and c[4] == "pyg" else
             1 if (c[0], c[5]) in {("arxiv-like", 1024), ("pokec-like", 4096)} else 2 for c in order[len(first):]]
    assert tiers == sorted(tiers)
    # each (graph, sampler, batch) group is contiguous after the targets
    groups = [(c[0], c[4], c[5]) for c in order[len(first):]]
    changes = sum(1 for a, b in zip(groups, groups[1:]) if a != b)
    assert changes == len(set(groups)) - 1
    # a selection without the targets' cases still covers every config
    assert BT.plan_sampled(["arxiv-like"], ["gcn"], ["float32"], ["dgl"], [64]) == [
        ("arxiv-like", "gcn", "float32", "stock", "dgl", 64), ("arxiv-like", "gcn", "float32", "enabled", "dgl", 64)]


def _srow(graph, layer, mode, batch, step, whole=None, loader=None, sampler="pyg", dtype="float32", phases=None):
    r = {"graph": graph, "layer_key": layer, "layer": BT.sampled_layer_label(sampler, layer), "dtype": dtype,
         "mode": mode, "sampler": sampler, "batch_size": batch, "step_ms": step,
         "status": step if isinstance(step, str) else "ok"}
    if whole is not None:
        r["whole_ms"], r["whole_status"] = whole, "ok"
    if loader is not None:
        r["loader_ms"] = loader
        b = BT.sampler_bound(loader, step)
        if b:
            r["bound"] = b
    if phases is not None:
        r["phases"] = phases
    return r


PHASES = {"n": 3, "cold": {"fwd_ms": 6.0, "bwd_ms": 4.0, "opt_ms": 0.5, "total_ms": 10.5, "fwd_host_ms": 5.0,
                           "bwd_host_ms": 1.0, "opt_host_ms": 0.4, "total_host_ms": 6.4},
          "warm": {"fwd_ms": 3.0, "bwd_ms": 3.0, "opt_ms": 0.5, "total_ms": 6.5, "fwd_host_ms": 2.9,
                   "bwd_host_ms": 1.0, "opt_host_ms": 0.4, "total_host_ms": 4.3},
          "build_ms": {"fwd": 3.0, "bwd": 1.0, "opt": 0.0, "total": 4.0},
          "kernel_ms": {"forward": 1.0, "backward": 1.5, "optimizer": 0.3, "total": 2.8}}


def test_sampled_target_verdicts_and_tables():
    rows = [_srow("arxiv-like", "gatv2", "stock", 1024, 30.0, whole=40.0, loader=20.0),
            _srow("arxiv-like", "gatv2", "enabled", 1024, 10.0, whole=36.0, loader=20.0, phases=PHASES),
            _srow("arxiv-like", "transformer", "stock", 1024, 20.0),
            _srow("arxiv-like", "transformer", "enabled", 1024, 10.0, phases=PHASES),
            _srow("arxiv-like", "sage_max", "stock", 1024, OOM), _srow("arxiv-like", "sage_max", "enabled", 1024, 9.0),
            _srow("pokec-like", "gatv2", "enabled", 4096, "error"),
            # same keys with another sampler / batch / dtype must not be taken for the targets
            _srow("arxiv-like", "gcn", "stock", 1024, 50.0, sampler="dgl"),
            _srow("arxiv-like", "gcn", "enabled", 1024, 1.0, sampler="dgl"),
            _srow("arxiv-like", "gcn", "stock", 4096, 50.0), _srow("arxiv-like", "gcn", "enabled", 4096, 1.0),
            # full-batch rows of the same (graph, layer) are not sampled rows
            {"graph": "arxiv-like", "layer_key": "gcn", "dtype": "float32", "mode": "stock", "step_ms": 99.0,
             "status": "ok"}]
    res = {(t["graph"], t["layer"]): t for t in BT.evaluate_sampled_targets(rows)}
    g = res[("arxiv-like", "gatv2")]
    assert g["verdict"] == "met" and g["value"] == 3.0 and g["whole_x"] == pytest.approx(40 / 36)
    assert g["bound_by"] == {"stock": "model", "enabled": "sampler"} and g["loader_ms"] == 20.0
    # fwd+bwd elapsed 6.0 = 2.5 kernels + 3.5 host glue; build 4.0: build dominates
    assert g["dominant"].startswith("graph build 4.00 ms of 10.50")
    assert res[("arxiv-like", "transformer")]["verdict"] == "missed"
    assert res[("arxiv-like", "sage_max")]["verdict"] == "met (stock out of memory)"
    assert res[("arxiv-like", "gcn")]["verdict"] == "not measured (config not run)"
    p = res[("pokec-like", "gatv2")]["verdict"]
    assert p.startswith("not measured") and "enabled: error" in p and "config not run" in p
    # the full-batch evaluation ignores sampled rows
    assert all(t["verdict"].startswith("not measured") or t["graph"] != "arxiv-like" for t in BT.evaluate_targets(rows))
    payload = {"settings": {"modes": ["sampled"], "dtypes": ["float32"], "steps": 12, "warmup": 3,
                            "sampled": {"workers": 4, "whole_steps": 12, "fanouts": [15, 10, 5]}},
               "rows": rows, "loaders": [{"graph": "arxiv-like", "sampler": "pyg", "batch_size": 1024, "workers": 4,
                                          "loader_ms": 20.0, "batch_nodes": 1e5, "batch_edges": 3e5,
                                          "presample_s": 2.0, "status": "ok"}]}
    md = BT.markdown(payload)
    assert "3.00x" in md and "met (stock out of memory)" in md and "model / sampler" in md
    assert "100,000 / 300,000" in md and "Per-phase breakdown" in md
    table, cols, _ = BT.sampled_rows(payload)
    by = {(r["graph"], r["sampler"], r["batch"], r["layer"]): r for r in table}
    assert by[("arxiv-like", "pyg", 1024, "GATv2Conv x3")]["x"] == "3.00x"
    assert by[("arxiv-like", "pyg", 1024, "GATv2Conv x3")]["xw"] == "1.11x"
    assert by[("arxiv-like", "dgl", 1024, "DGL GraphConv x3")]["x"] == "50.00x"
    assert len(table) == 6


def test_dominant_phase_without_kernel_times():
    ph = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PHASES.items() if k != "kernel_ms"}
    ph["build_ms"] = {"fwd": 0.1, "bwd": 0.0, "opt": 0.0, "total": 0.1}
    # host issue time (3.9) >= 0.9 x fwd+bwd elapsed (6.0)? no: GPU-bound
    assert BT.dominant_phase(ph).startswith("fwd+bwd (GPU-bound) 6.00 ms")
    ph["warm"]["bwd_host_ms"] = 2.9
    assert BT.dominant_phase(ph).startswith("fwd+bwd (host-bound)")
    assert BT.dominant_phase(None) == "" and BT.dominant_phase({}) == ""
    assert BT.sampler_bound(5.0, 4.0) == "sampler" and BT.sampler_bound(3.0, 4.0) == "model"
    assert BT.sampler_bound(None, 4.0) is None and BT.sampler_bound(3.0, OOM) is None


def test_watchdog_prints_the_stack_and_exits():
    """A config that hangs (e.g. a deadlock) must leave a traceback and end the process."""
    import subprocess
    import textwrap

    code = textwrap.dedent("""
        import sys, time
        sys.path.insert(0, %r)
        from benchmarks.timing import watchdog
        with watchdog(None):
            pass
        with watchdog(0.2):
            time.sleep(0.05)  # finishes in time: cancelled
        def stuck_here():
            time.sleep(30)
        with watchdog(0.3):
            stuck_here()
        print("not reached")
    """ % ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    assert "Timeout" in out.stderr and "stuck_here" in out.stderr and "not reached" not in out.stdout


def test_sampled_loader_without_workers_when_workers_fail(tmp_path, monkeypatch, one_thread):
    """A loader whose worker processes fail (e.g. too little shared memory on the machine)
    falls back to sampling in the process: the model step is still measured."""
    _dgl_or_skip()

    class NoWorkers(BT.BatchSource):
        def __init__(self, sampler, data, batch_size, fanouts, workers, *args, **kwargs):
            if workers > 0:
                raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Bus error")
            super().__init__(sampler, data, batch_size, fanouts, workers, *args, **kwargs)

    monkeypatch.setattr(BT, "BatchSource", NoWorkers)
    payload, md = _run_sampled(tmp_path, "--samplers", "dgl", "--layers", "gcn", "--workers", "2")
    [loader] = payload["loaders"]
    assert loader["status"] == "ok" and loader["workers"] == 0 and "Bus error" in loader["workers_error"]
    assert all(r["status"] == "ok" and r["workers"] == 0 and isinstance(r["whole_ms"], float)
               for r in payload["rows"])
    assert "ran without" in md
