"""CPU smoke tests of benchmarks/bench_train.py: every code path of the training benchmark on a
tiny graph (stock vs ``enable(cpu="reference")``, fp32 and bf16 autocast), the config order,
the target verdicts, OOM handling and the time budget. Timings mean nothing here."""
import contextlib
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


# ----------------------------------------------------------------------------- torch.compile rows, fixed-size batches
def test_parse_compile_modes_and_cli():
    assert BT.parse_compile_modes("none") == [] and BT.parse_compile_modes(None) == []
    assert BT.parse_compile_modes("none,default,reduce-overhead") == ["default", "reduce-overhead"]
    assert BT.parse_compile_modes(" reduce-overhead , default,default,") == ["reduce-overhead", "default"]
    with pytest.raises(SystemExit, match="unknown mode 'max-autotune'"):
        BT.parse_compile_modes("default,max-autotune")
    args = BT.parse_args([])
    assert args.compile == "none" and args.compile_warmup == BT.COMPILE_WARMUP and args.pad_batches is None
    assert args.compile_backend == "inductor" and args.pad_slack == BT.PAD_SLACK
    args = BT.parse_args(["--compile", "none,reduce-overhead", "--compile-warmup", "4", "--no-pad-batches",
                          "--pad-slack", "1.1"])
    assert args.compile == "none,reduce-overhead" and args.compile_warmup == 4 and args.pad_batches is False
    assert args.pad_slack == 1.1
    assert BT.parse_args(["--pad-batches"]).pad_batches is True
    pytest.importorskip("torch_geometric")  # main() returns early without PyG
    for bad in (["--compile", "fast"], ["--compile-warmup", "0"], ["--pad-slack", "0.9"]):
        with pytest.raises(SystemExit):
            BT.main(TINY + bad + ["--json", "", "--markdown", ""])


def test_plan_compiled_orders_eager_then_modes():
    eager = BT.plan(["arxiv-like"], ["gatv2", "gcn"], ["float32", "bfloat16"])
    order = BT.plan_compiled(eager, ["reduce-overhead", "default"])
    assert order[:len(eager)] == eager and len(order) == len(set(order)) == 3 * len(eager)
    compiled = order[len(eager):]
    assert [c[4] for c in compiled] == ["reduce-overhead"] * len(eager) + ["default"] * len(eager)
    # per (graph, layer, dtype) of the eager order: enabled, then stock
    assert compiled[0] == eager[0][:3] + ("enabled", "reduce-overhead")
    assert compiled[1] == eager[0][:3] + ("stock", "reduce-overhead")
    assert BT.plan_compiled(eager, []) == eager


def test_plan_sampled_compiled_groups_by_source():
    eager = BT.plan_sampled(["arxiv-like", "pokec-like"], ["gatv2", "gcn"], ["float32"], ["pyg", "dgl"], [1024, 4096])
    assert BT.plan_sampled_compiled(eager, []) == eager
    order = BT.plan_sampled_compiled(eager, ["reduce-overhead"])
    assert sorted(c for c in order if len(c) == 6) == sorted(eager)
    compiled = [c for c in order if len(c) == 7]
    # compiled rows only for the PyG sampler, one per eager PyG config
    assert all(c[4] == "pyg" and c[6] == "reduce-overhead" for c in compiled)
    assert sorted(c[:6] for c in compiled) == sorted(c for c in eager if c[4] == "pyg")
    # every (graph, sampler, batch) group is contiguous: its loader is built once
    groups = [(c[0], c[4], c[5]) for c in order]
    assert sum(1 for a, b in zip(groups, groups[1:]) if a != b) == len(set(groups)) - 1
    # inside a group: the eager configs first, then the compiled ones
    first = [c for c in order if (c[0], c[4], c[5]) == groups[0]]
    assert [len(c) for c in first] == sorted(len(c) for c in first)
    assert groups[0] == ("arxiv-like", "pyg", 1024)  # the targets' group still comes first


def test_pad_caps():
    assert BT.pad_caps([100, 300, 200], [1000, 990], slack=1.0, multiple=1) == (301, 1000)
    n, m = BT.pad_caps([100, 300, 200], [1000, 990], slack=1.05, multiple=256)
    assert n == 512 and m == 1280 and n % 256 == 0 and m % 256 == 0
    # a node count already at a multiple still gets a spare row for the dummy
    assert BT.pad_caps([256], [256], slack=1.0, multiple=256) == (512, 256)


def test_pad_batch_sizes_dummy_edges_zero_features():
    torch.manual_seed(0)
    n, m, bs, n_cap, m_cap = 37, 90, 8, 64, 128
    x, ei = torch.randn(n, 5), torch.randint(0, n, (2, m))
    xp, eip = BT.pad_batch(x, ei, n_cap, m_cap, batch_size=bs)
    assert xp.shape == (n_cap, 5) and eip.shape == (2, m_cap) and eip.dtype == ei.dtype
    assert torch.equal(xp[:n], x) and not xp[n:].any()  # padding rows: zero features
    assert torch.equal(eip[:, :m], ei)  # real edges kept, in order
    pad = eip[:, m:]
    assert (pad[0] == pad[1]).all() and (pad[0] >= n).all() and (pad[0] < n_cap).all()  # loops on padding nodes
    counts = torch.bincount(pad[0] - n, minlength=n_cap - n)
    assert int(counts.max()) - int(counts.min()) <= 1  # dealt round-robin: no padding super node
    # no padding edge touches a real node
    real = (eip[0] < n) | (eip[1] < n)
    assert int(real.sum()) == m
    # caps too small: refused (nodes need the spare dummy row)
    with pytest.raises(ValueError):
        BT.pad_batch(x, ei, n, m_cap)
    with pytest.raises(ValueError):
        BT.pad_batch(x, ei, n_cap, m - 1)
    xp, eip = BT.pad_batch(x, ei, n + 1, m)  # exact fit: the dummy alone, no padding edge
    assert xp.shape[0] == n + 1 and eip.shape[1] == m


def test_pad_kept_keeps_seeds_labels_and_counts():
    torch.manual_seed(0)
    src = BT.BatchSource.__new__(BT.BatchSource)  # no loader: pad_kept needs the sampler and device only
    src.sampler, src.cuda = "pyg", False
    kept = [{"x": torch.randn(n, 3), "graph": torch.randint(0, n, (2, m)), "y": torch.randint(0, 4, (10,)),
             "batch_size": 10, "nodes": n, "edges": m} for n, m in ((40, 100), (55, 80), (47, 130))]
    padded, n_cap, m_cap = src.pad_kept(kept, slack=1.0)
    assert (n_cap, m_cap) == (BT._round_up(56, BT.PAD_MULTIPLE), BT._round_up(130, BT.PAD_MULTIPLE))
    for b, p in zip(kept, padded):
        assert p["x"].shape[0] == n_cap and p["graph"].shape[1] == m_cap
        assert p["y"] is b["y"] and p["batch_size"] == 10  # the loss mask (first batch_size rows) is unchanged
        assert (p["nodes"], p["edges"]) == (b["nodes"], b["edges"])  # real counts stay
        assert (p["padded_nodes"], p["padded_edges"]) == (n_cap, m_cap)
    src.sampler = "dgl"
    with pytest.raises(ValueError):
        src.pad_kept(kept)


@pytest.mark.parametrize("layer", ["gcn", "sage_max", "gatv2"])
@pytest.mark.parametrize("mode", ["stock", "enabled"])
def test_padded_batch_same_loss_on_the_seeds(layer, mode):
    """Padding nodes and dummy edges never reach a real node: the model gives the same outputs
    on every real node, so the same loss on the seeds, padded or not. Stock in float64 (equal to
    rounding); enabled in float32 (the fused path takes no float64: it would fall back to stock),
    through the shims on the reference ops."""
    pyg = pytest.importorskip("torch_geometric")
    gf = pytest.importorskip("gnn_fastpath")
    torch.manual_seed(0)
    dt = torch.float64 if mode == "stock" else torch.float32
    tol = dict(rtol=1e-10, atol=1e-12) if mode == "stock" else dict(rtol=1e-5, atol=1e-6)
    n, m, bs = 60, 240, 16
    x, ei, y = torch.randn(n, 6, dtype=dt), torch.randint(0, n, (2, m)), torch.randint(0, 3, (bs,))
    model = BT.Net(pyg, layer, 6, 3, hidden=4, heads=2, attn_dropout=0.0, feat_dropout=0.0, num_layers=2,
                   gcn_cached=False).to(dt).eval()
    xp, eip = BT.pad_batch(x, ei, 128, 512, batch_size=bs)
    gf.reset_stats()
    ctx = gf.enabled(frameworks="pyg", cpu="reference") if mode == "enabled" else contextlib.nullcontext()
    with ctx, torch.no_grad():
        out, outp = model(x, ei), model(xp, eip)
    if mode == "enabled":
        counts = BT.stats_counts(gf.stats())
        assert counts["fused_reference"] == 4 and not counts["fallback"], counts
    assert torch.allclose(outp[:n], out, **tol)
    loss = torch.nn.functional.cross_entropy(out[:bs], y)
    lossp = torch.nn.functional.cross_entropy(outp[:bs], y)
    assert torch.allclose(loss, lossp, **tol)


def _crow(graph, layer, dtype, mode, step, compile=None, sampler=None, batch=None, **extra):
    r = {"graph": graph, "layer_key": layer, "layer": BT.LAYER_LABELS[layer], "dtype": dtype, "mode": mode,
         "step_ms": step, "status": step if isinstance(step, str) else "ok"}
    if compile:
        r["compile"] = compile
    if sampler:
        r.update(sampler=sampler, batch_size=batch)
    r.update(extra)
    return r


def test_compile_comparisons_verdicts_and_tables():
    ro, dflt = "reduce-overhead", "default"
    rows = [
        # tolokers full batch, reduce-overhead: 1.5x wanted
        _crow("tolokers", "gatv2", "float32", "stock", 30.0), _crow("tolokers", "gatv2", "float32", "enabled", 6.0),
        _crow("tolokers", "gatv2", "float32", "enabled", 3.0, ro, compile_s=20.0, graph_breaks=0, recompiles=0,
              cudagraph_records_timed=0, cudagraph_skips=0, compiled_calls={"cuda": 3}),
        _crow("tolokers", "gatv2", "float32", "stock", 12.0, ro, compile_s=15.0, graph_breaks=3, recompiles=2,
              cudagraph_records_timed=1, cudagraph_skips=0),
        # default mode: 1x wanted; 5.0 vs eager 6.0 is met there
        _crow("tolokers", "gatv2", "float32", "enabled", 5.0, dflt, compile_s=18.0, recompiles=0),
        # arxiv-like b1024 sampled, reduce-overhead, 1.2x: missed (1.5x wanted); padded batches
        _crow("arxiv-like", "gcn", "float32", "stock", 10.0, sampler="pyg", batch=1024, padded=True,
              padded_nodes=40192, padded_edges=101120),
        _crow("arxiv-like", "gcn", "float32", "enabled", 6.0, sampler="pyg", batch=1024, padded=True,
              padded_nodes=40192, padded_edges=101120),
        _crow("arxiv-like", "gcn", "float32", "enabled", 5.0, ro, sampler="pyg", batch=1024, padded=True,
              padded_nodes=40192, padded_edges=101120, compile_s=9.0, recompiles=0, cudagraph_skips=2),
        _crow("arxiv-like", "gcn", "float32", "stock", "error", ro, sampler="pyg", batch=1024, padded=True),
    ]
    comps = {(c["graph"], c["compile"]): c for c in BT.compile_comparisons(rows)}
    assert len(comps) == 3
    t = comps[("tolokers", ro)]
    assert t["bound"] == 1.5 and t["x_vs_eager_enabled"] == 2.0 and t["verdict"] == "met"
    assert t["x_vs_compiled_stock"] == 4.0 and t["x_stock_vs_eager"] == 2.5
    assert t["compile_s_enabled"] == 20.0 and t["graph_breaks_stock"] == 3 and t["recompiles_stock"] == 2
    assert any("2 recompile(s) during the timed steps" in n for n in t["notes"])  # reported, not hidden
    assert any("1 CUDA graph(s) recorded" in n for n in t["notes"])
    d = comps[("tolokers", dflt)]
    assert d["bound"] == 1.0 and d["verdict"] == "met" and d["compiled_stock_ms"] is None
    a = comps[("arxiv-like", ro)]
    assert a["kind"] == "sampled" and a["bound"] == 1.5 and a["verdict"] == "missed"
    assert a["padded"] and a["padded_nodes"] == 40192 and a["x_vs_compiled_stock"] is None
    assert any(n.startswith("compiled stock: error") for n in a["notes"])
    assert any("CUDA graphs skipped 2x" in n for n in a["notes"])
    # pokec-like or another batch size under reduce-overhead: 1x
    assert BT.compile_bound("sampled", "arxiv-like", "pyg", 4096, ro) == 1.0
    assert BT.compile_bound("full", "arxiv-like", None, None, ro) == 1.0
    assert BT.compile_bound("full", "tolokers", None, None, dflt) == 1.0
    # not measured: a compiled enabled row that failed
    bad = BT.compile_comparisons([_crow("tolokers", "gcn", "float32", "enabled", 6.0),
                                  _crow("tolokers", "gcn", "float32", "enabled", "error", ro)])
    assert bad[0]["verdict"].startswith("not measured") and "compiled enabled: error" in bad[0]["verdict"]
    # the rows get their own speedups
    BT.annotate_compiled(rows)
    assert rows[2]["x_vs_eager"] == 2.0 and rows[2]["x_vs_compiled_stock"] == 4.0 and rows[3]["x_vs_eager"] == 2.5
    assert "x_vs_eager" not in rows[0]
    # eager evaluations and tables ignore compiled rows (same keys otherwise)
    targets = {(t["graph"], t["layer"], t["dtype"]): t for t in BT.evaluate_targets(rows)}
    assert targets[("tolokers", "gatv2", "bfloat16")]["verdict"].startswith("not measured")
    srows = [r for r in rows if r.get("sampler")] + [
        _crow("arxiv-like", "gatv2", "float32", m, s, sampler="pyg", batch=1024, padded=True)
        for m, s in (("stock", 20.0), ("enabled", 8.0))]
    st = {(t["graph"], t["layer"]): t for t in BT.evaluate_sampled_targets(srows)}
    assert st[("arxiv-like", "gcn")]["value"] == pytest.approx(10 / 6) and st[("arxiv-like", "gcn")]["padded"] is True
    assert st[("arxiv-like", "gatv2")]["value"] == 2.5
    payload = {"settings": {"modes": ["full", "sampled"], "dtypes": ["float32"], "steps": 6, "warmup": 2,
                            "compile": {"modes": [ro, dflt], "backend": "inductor", "warmup": 3, "padded": True,
                                        "pad_slack": 1.02}, "sampled": {"workers": 4, "whole_steps": 6}},
               "rows": rows}
    full, _, _ = BT.summary_rows(payload)
    assert len(full) == 1 and full[0]["float32_x"] == "5.00x"
    sampled, _, _ = BT.sampled_rows(payload)
    assert len(sampled) == 1 and sampled[0]["x"] == "1.67x"
    md = BT.markdown(payload)
    assert "torch.compile: compiled stock / enabled vs eager" in md and "fixed-size batches" in md
    assert "tolokers full batch" in md and "arxiv-like pyg b1024" in md and "40,192 / 101,120" in md
    assert "2.00x" in md and "4.00x" in md and ">= 1.5x" in md and "missed" in md
    assert "compiled cuda 3" in BT.path_summary(_crow("t", "gatv2", "float32", "enabled", 1.0, ro, fused_cuda=0,
                                                      compiled_calls={"cuda": 3}))


@pytest.fixture
def fresh_inductor_cache(tmp_path, monkeypatch):
    """A new inductor cache: a cached graph from another version of the custom operators must
    not be replayed (and the compile time is then a cold one)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    yield
    torch._dynamo.reset()


def test_compile_default_smoke_full_and_sampled(tmp_path, one_thread, fresh_inductor_cache):
    """--compile default on the CPU (inductor, C++ backend), one tiny SAGE-max model, full batch
    and PyG-sampled: compiled rows beside the eager ones, compile fields, padded batches for
    every sampled row, eager included; the eager tables keep their rows."""
    pytest.importorskip("torch_geometric")
    _pyg_sampler_or_skip()
    js, md = tmp_path / "compile.json", tmp_path / "compile.md"
    args = [a for a in SAMPLED if a not in ("--mode", "sampled")] + [
        "--mode", "both", "--graphs", "arxiv-like", "--layers", "sage_max", "--samplers", "pyg", "--num-layers", "1",
        "--no-whole", "--steps", "2", "--compile", "none,default", "--compile-warmup", "2",
        "--json", str(js), "--markdown", str(md)]
    assert BT.main(args) == 0
    payload = json.loads(js.read_text())
    rows = payload["rows"]
    assert [(BT.is_sampled(r), r["mode"], r.get("compile")) for r in rows] == [
        (False, "stock", None), (False, "enabled", None), (False, "enabled", "default"), (False, "stock", "default"),
        (True, "stock", None), (True, "enabled", None), (True, "enabled", "default"), (True, "stock", "default")]
    for r in rows:
        assert r["status"] == "ok" and isinstance(r["step_ms"], float) and r["finite_losses"], r
        assert len(r["step_ms_all"]) == 2
        if BT.is_compiled(r):
            assert r["compile_backend"] == "inductor" and r["compile_warmup"] == 2
            assert isinstance(r["compile_s"], float) and r["compile_s"] > 0
            assert r["graph_breaks"] == 0 and r["recompiles"] == 0, r  # SAGE traces whole; no recompile when timed
            assert r["compiles_warmup"]["frames"] >= 1 and r["compiles_timed"]["frames"] == 0
            assert isinstance(r["x_vs_eager"], float)
            if r["mode"] == "enabled":
                # the enabled model traced the fused path onto the custom operators (CPU reference)
                assert r["compiled_calls"] == {"reference": 1} and isinstance(r["x_vs_compiled_stock"], float), r
        else:
            assert "compile" not in r and "compile_s" not in r  # eager rows: the schema as before
        if BT.is_sampled(r):  # fixed-size batches for every PyG row, eager too
            assert r["padded"] is True and r["padded_nodes"] > r["batch_nodes"] and r["padded_edges"] >= r["batch_edges"]
    [loader] = payload["loaders"]
    assert loader["padded"] and loader["padded_nodes"] > loader["batch_nodes_max"]
    assert payload["settings"]["compile"]["modes"] == ["default"]
    assert payload["settings"]["compile"]["eager_rows_padded"] is True
    assert payload["settings"]["sampled"]["padded"] is True
    comps = payload["compiled"]
    assert [(c["kind"], c["compile"]) for c in comps] == [("full", "default"), ("sampled", "default")]
    assert all(c["verdict"] in ("met", "missed") and c["bound"] == 1.0 for c in comps)
    text = md.read_text()
    assert "torch.compile: compiled stock / enabled vs eager" in text and "padded to" in text
    # the eager tables are those of a run without --compile: one row per (graph, layer)
    assert len(BT.summary_rows(payload)[0]) == 1 and len(BT.sampled_rows(payload)[0]) == 1


def test_pad_batches_flag_without_compile(tmp_path, one_thread):
    """--pad-batches pads the sampled rows of an eager run; without it (and no --compile) nothing
    changes: no padded keys, no compiled section."""
    _pyg_sampler_or_skip()
    payload, md = _run_sampled(tmp_path, "--samplers", "pyg", "--layers", "gcn", "--no-whole", "--pad-batches")
    assert all(r["padded"] and r["status"] == "ok" for r in payload["rows"])
    assert payload["settings"]["sampled"]["padded"] is True and "compile" not in payload["settings"]
    assert "compiled" not in payload and "torch.compile" not in md
    payload, _ = _run_sampled(tmp_path, "--samplers", "pyg", "--layers", "gcn", "--no-whole")
    assert not any("padded" in r for r in payload["rows"]) and not payload["settings"]["sampled"]["padded"]
