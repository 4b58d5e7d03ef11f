"""The op and layer benchmarks as commands on the CPU (reference backend, stock vs
``enable(cpu="reference")``; timings mean nothing), and the report's summary and compact form
of their JSON."""
import json

import pytest


def test_ops_two_dtypes_summary_and_compact(tool, result, tmp_path):
    js, md = tmp_path / "ops.json", tmp_path / "ops.md"
    tool("bench_ops", "--graphs", "arxiv-like", "--scale", "0.002", "--ops", "spmm,segment_reduce", "--dtypes",
         "fp32,bf16", "--json-out", js, "--md", md, "--warmup", "1", "--iters", "1")
    payload = result(js, "ops")
    assert payload["settings"]["dtypes"] == ["float32", "bfloat16"]
    ok = {(r["op"], r["dtype"]) for r in payload["rows"] if r.get("status") == "ok"}
    assert ok == {(o, d) for o in ("spmm", "segment_reduce") for d in ("float32", "bfloat16")}
    for r in payload["rows"]:  # the floor of the row's own dtype's bytes
        assert r["bytes_fwd"] > 0 and r["bytes_fwd_bwd"] > r["bytes_fwd"] and isinstance(r["fwd_ms"], float), r
    by = {(r["op"], r["dtype"]): r for r in payload["rows"]}
    assert by[("spmm", "bfloat16")]["bytes_fwd"] < 0.6 * by[("spmm", "float32")]["bytes_fwd"]
    assert "| bfloat16 |" in md.read_text()
    assert "| spmm | bf16 |" in tool("report", "summary", js).stdout
    # the committed form: no per-call lists, one row per line, the same rows
    small = tmp_path / "ops-compact.json"
    tool("report", "compact", js, small)
    compact = json.loads(small.read_text())
    assert len(compact["rows"]) == len(payload["rows"]) and not any("fwd_ms_all" in r for r in compact["rows"])
    assert small.read_text().count("\n") > len(payload["rows"])


def test_layers_autocast(tool, result, tmp_path):
    pytest.importorskip("torch_geometric")
    js, md = tmp_path / "layers.json", tmp_path / "layers.md"
    tool("bench_layers", "--graphs", "arxiv-like", "--scale", "0.002", "--layers", "sage_max", "--autocast", "off,bf16",
         "--json-out", js, "--md", md, "--warmup", "1", "--iters", "1")
    payload = result(js, "layers")
    rows = {r["autocast"]: r for r in payload["rows"]}
    assert set(rows) == {"off", "bfloat16"}
    for r in rows.values():
        assert isinstance(r["stock_fwd_ms"], float) and isinstance(r["fused_fwd_ms"], float), r
    assert "bfloat16" in md.read_text()
