"""The A/B comparison table (benchmarks/compare_runs.py) as a command, over made-up runs of
every kind it reads."""
import json


def _write(path, rows):
    path.write_text(json.dumps({"rows": rows}))


def test_every_kind_is_compared_with_its_noise(tool, tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    for tree, ms in (("before", (1.0, 1.1)), ("after", (1.5, 1.5))):
        for r, t in enumerate(ms, 1):
            _write(d / f"ops-{tree}-{r}.json", [
                {"graph": "g", "op": "spmm", "shape": "F=8", "dtype": "float32", "variant": "default", "status": "ok",
                 "backend": "cuda", "fwd_ms": t},
                {"graph": "g", "op": "spmm", "shape": "F=8", "dtype": "float32", "variant": "default", "status": "ok",
                 "backend": "reference", "fwd_ms": 99.0}])  # the reference backend is not compared
            _write(d / f"host-{tree}-{r}.json", [
                {"label": "PyG GCNConv", "pass": "fwd", "graph": "same", "mode": "enabled", "status": "ok",
                 "backend": "cuda", "host_us": 100 * t},
                {"label": "PyG GCNConv", "pass": "fwd", "graph": "same", "mode": "stock", "status": "ok",
                 "backend": None, "host_us": 300.0}])
            _write(d / f"train-{tree}-{r}.json", [
                {"graph": "g", "layer": "GCNConv x3", "dtype": "bfloat16", "mode": "enabled", "status": "ok",
                 "step_ms": 2 * t},
                {"graph": "g", "layer": "GCNConv x3", "dtype": "bfloat16", "mode": "stock", "status": "OOM"}])
    md = tmp_path / "ab.md"
    out = tool("compare_runs", d, "--md", md).stdout
    lines = {line.split(" | ")[1]: line for line in out.splitlines() if line.startswith("| ") and " | " in line}
    assert set(lines) == {"row", "---", "g / spmm / F=8 / float32 / default", "PyG GCNConv / fwd / same / enabled",
                          "PyG GCNConv / fwd / same / stock", "g / GCNConv x3 / bfloat16 / enabled"}
    # before: median of 1.0 and 1.1 = 1.05, spread 0.1/1.05; after 1.5: 1.429x, beyond the noise
    spmm = lines["g / spmm / F=8 / float32 / default"]
    assert "| 1.050 | 1.500 | 1.429 **slower** | 9.5% |" in spmm
    assert "| 105.000 | 150.000 | 1.429 **slower** |" in lines["PyG GCNConv / fwd / same / enabled"]
    assert "| 300.000 | 300.000 | 1.000 | 0.0% |" in lines["PyG GCNConv / fwd / same / stock"]
    assert "4 timings" in out and md.read_text().strip() == out.strip()
