"""``python -m benchmarks.plot`` draws the speedup and memory plots of a training result
(a stock row out of memory included) as PNG files."""
import json

import pytest

pytest.importorskip("matplotlib")


def _row(graph, layer, dtype, mode, step, peak):
    return {"graph": graph, "layer_key": layer, "dtype": dtype, "mode": mode, "step_ms": step, "peak_mb": peak,
            "status": "OOM" if step == "OOM" else "ok"}


def test_training_plots(tool, tmp_path):
    rows = [_row("tolokers", "gatv2", d, m, s, p) for d in ("float32", "bfloat16")
            for m, s, p in (("stock", 60.0, 8000.0), ("enabled", 6.0, 300.0))]
    rows += [_row("pokec-like", "gatv2", "float32", "stock", "OOM", None),
             _row("pokec-like", "gatv2", "float32", "enabled", 200.0, 20000.0)]
    src = tmp_path / "2026-01-01-h200-train-full-abc1234.json"
    src.write_text(json.dumps({"benchmark": "train_full", "environment": {"gpu": "NVIDIA H200"},
                               "run": {"date": "2026-01-01", "commit": "abc1234"}, "rows": rows}))
    out = tool("plot", src, "--out", tmp_path / "png").stdout
    for kind in ("speedup", "memory"):
        png = tmp_path / "png" / f"{src.stem}-{kind}.png"
        assert str(png) in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 200_000
    other = tmp_path / "host.json"
    other.write_text(json.dumps({"benchmark": "host", "rows": []}))
    assert "no plot" in tool("plot", other).stdout
