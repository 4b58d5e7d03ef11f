"""The new-graph benchmark as a command on the CPU (the shims on the reference ops: times
there include the compute; what is checked is that every mode ran and agreed with stock)."""
import pytest

from test_training_tools import _pyg_sampler_reason

pytest.importorskip("torch_geometric")

MODES = ("stock", "exact", "static", "rule")


def test_modes_agree_with_stock(tool, result, tmp_path):
    reason = _pyg_sampler_reason()
    if reason:
        pytest.skip(reason)
    js, md = tmp_path / "ng.json", tmp_path / "ng.md"
    tool("bench_new_graph", "--device", "cpu", "--scale", "0.005", "--batch-size", "64", "--batches", "3",
         "--rounds", "1", "--layers", "gatv2,sage_max", "--dtypes", "float32", "--json", js, "--markdown", md)
    payload = result(js, "new_graph")
    assert [(r["layer"], r["dtype"]) for r in payload["rows"]] == [("gatv2", "float32"), ("sage_max", "float32")]
    for r in payload["rows"]:
        assert set(r["max_abs"]) == {"exact", "static", "rule"} and max(r["max_abs"].values()) < 1e-4, r
        for mode in MODES:
            assert r[mode]["ms"] > 0 and r[mode]["host_ms"] > 0 and r[mode]["syncs"] is None, (mode, r)
        assert r["exact"]["build_ms"] > 0 and r["static"]["build_ms"] > 0
    assert payload["edges_mean"] > 0
    text = md.read_text()
    assert "| gatv2 | float32 |" in text and "build ms exact / static" in text
