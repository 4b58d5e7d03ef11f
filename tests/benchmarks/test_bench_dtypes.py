"""CPU tests of the reduced-precision options of the op and layer benchmarks (issue 10):
``bench_ops --dtypes`` (per-dtype byte floors, the 16-bit / fp32 ratio table and its verdicts)
and ``bench_layers --autocast``; smoke runs on tiny graphs, timings meaningless."""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import bench_ops as BO  # noqa: E402
from benchmarks import report  # noqa: E402
from benchmarks.timing import autocast, parse_dtypes  # noqa: E402


@pytest.fixture(autouse=True)
def _bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_BENCH_CACHE", str(tmp_path / "cache"))


def test_parse_dtypes_and_autocast():
    assert parse_dtypes("fp32, bf16,float16,bfloat16") == ["float32", "bfloat16", "float16"]
    with pytest.raises(SystemExit, match="float64"):
        parse_dtypes("float64")
    with autocast(torch.device("cpu"), "bfloat16"):
        assert torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), "float32"):
        assert not torch.is_autocast_enabled("cpu")


def test_floor_bytes_follow_the_dtype():
    n, m, w = 1000, 50_000, 128
    csr = BO.csr_bytes(n, m)
    for op, case in BO.OPS.items():
        f32 = BO.floor_bytes(op, n, m, case.width, case.heads)
        b16 = BO.floor_bytes(op, n, m, case.width, case.heads, elem=2)
        assert f32 == BO.floor_bytes(op, n, m, case.width, case.heads, elem=4)  # fp32 unchanged by default
        # features move in half the bytes; indices, statistics and edge values do not shrink
        assert 0.5 * f32["fwd"] < b16["fwd"] < 0.6 * f32["fwd"], op
    # segment_reduce max: gather + out in the dtype, the arg index int32
    b16 = BO.floor_bytes("segment_reduce", n, m, w, 1, elem=2)
    assert b16["fwd"] == m * w * 2 + n * w * 2 + n * w * 4 + csr
    assert b16["bwd"] == 3 * n * w * 2 + n * w * 4


def _op_row(graph, op, dtype, fwd, fb, variant="default", status="ok"):
    return {"graph": graph, "op": op, "dtype": dtype, "backend": "cuda", "variant": variant, "fwd_ms": fwd,
            "fwd_bwd_ms": fb, "status": status}


def test_ratio_rows_verdicts():
    rows = [_op_row("arxiv-like", "spmm", "float32", 1.0, 2.0), _op_row("arxiv-like", "spmm", "bfloat16", 0.5, 1.1),
            _op_row("pokec-like", "spmm", "float32", 10.0, 20.0), _op_row("pokec-like", "spmm", "bfloat16", 7.0, 11.0),
            _op_row("tolokers", "spmm", "float32", 1.0, 1.0), _op_row("tolokers", "spmm", "bfloat16", 0.9, 0.9),
            _op_row("arxiv-skewdst", "spmm", "float32", 1.0, 2.0),
            _op_row("arxiv-skewdst", "spmm", "bfloat16", "OOM", "OOM", status="OOM"),
            {"graph": "arxiv-like", "op": "spmm", "dtype": "float32", "backend": "reference", "fwd_ms": 9.0}]
    payload = {"settings": {"graphs": ["tolokers", "arxiv-like", "arxiv-skewdst", "pokec-like"]}, "rows": rows}
    out = {r["graph"]: r for r in BO.ratio_rows(payload)}
    assert out["arxiv-like"]["verdict"] == "met" and out["arxiv-like"]["ratio_fwd"] == "0.50"
    assert out["pokec-like"]["verdict"] == "missed (fwd 0.70)"
    assert out["tolokers"]["verdict"].startswith("-")
    assert out["arxiv-skewdst"]["verdict"].startswith("not measured")
    assert [r["graph"] for r in BO.ratio_rows(payload)] == ["tolokers", "arxiv-like", "arxiv-skewdst", "pokec-like"]
    text = BO.markdown({"environment": {}, "settings": {"graphs": payload["settings"]["graphs"], "warmup": 1,
                                                        "iters": 1}, "rows": rows})
    assert "16-bit / fp32" in text and "missed (fwd 0.70)" in text


def test_bench_ops_smoke_two_dtypes(tmp_path):
    js = tmp_path / "ops.json"
    assert BO.main(["--graphs", "arxiv-like", "--scale", "0.002", "--ops", "spmm,segment_reduce",
                    "--dtypes", "float32,bfloat16", "--json-out", str(js), "--md", str(tmp_path / "ops.md"),
                    "--warmup", "1", "--iters", "1"]) == 0
    payload = json.loads(js.read_text())
    assert payload["settings"]["dtypes"] == ["float32", "bfloat16"]
    seen = {(r["op"], r["dtype"]) for r in payload["rows"] if r.get("status") == "ok"}
    if torch.cuda.is_available():
        pytest.skip("the smoke run's expectations are for the CPU")
    assert seen == {(o, d) for o in ("spmm", "segment_reduce") for d in ("float32", "bfloat16")}
    assert "| bfloat16 |" in (tmp_path / "ops.md").read_text()
    assert "dtype" in report.summarize([str(js)])


def test_bench_layers_autocast_smoke(tmp_path):
    pytest.importorskip("torch_geometric")
    from benchmarks import bench_layers as BL

    assert BL.parse_autocast("off,bf16") == ["off", "bfloat16"]
    assert BL.parse_autocast("bfloat16") == ["bfloat16"]
    assert BL.parse_autocast("") == ["off"]
    js = tmp_path / "layers.json"
    assert BL.main(["--graphs", "arxiv-like", "--scale", "0.002", "--layers", "sage_max", "--autocast", "off,bf16",
                    "--json-out", str(js), "--md", str(tmp_path / "layers.md"), "--warmup", "1", "--iters", "1"]) == 0
    payload = json.loads(js.read_text())
    rows = {r["autocast"]: r for r in payload["rows"]}
    assert set(rows) == {"off", "bfloat16"}
    for r in rows.values():
        assert isinstance(r.get("stock_fwd_ms"), float), r
    assert "bfloat16" in (tmp_path / "layers.md").read_text()
