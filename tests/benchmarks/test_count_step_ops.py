"""The CPU count of a training step's operations (benchmarks/count_step_ops.py) as a command, and
what it proves without a GPU: no fused step makes a tensor from Python data (on a GPU a blocking
copy, i.e. a host synchronisation, which torch's sync counter on the CPU never sees), the exact
route reads back one thing per new graph (its edge facts) and the static route nothing."""
import pytest

pytest.importorskip("torch_geometric")

LAYERS = ("gatv2", "transformer", "gat", "gcn", "sage_max", "sage_mean")


def test_counts_every_route(tool, result, tmp_path):
    js, md = tmp_path / "c.json", tmp_path / "c.md"
    tool("count_step_ops", "--layers", "gcn,transformer", "--dtypes", "float32", "--targets", "120", "--top", "3",
         "--json", js, "--markdown", md)
    rows = result(js, "count_step_ops")["rows"]
    assert [(r["layer"], r["route"]) for r in rows] == [(layer, route) for layer in ("gcn", "transformer")
                                                         for route in ("stock", "exact", "static")]
    for r in rows:
        assert r["ops"] > 50 and r["top_issuers"], r
        if r["route"] == "stock":
            assert r["launches"] == 0 and r["cusparse"] == 0
        else:  # the fused kernels ran, each pass
            assert r["launches"] + r["cusparse"] >= 4, r
    text = md.read_text()
    assert "| gcn | float32 | exact |" in text and "blocking copies" in text


def test_fused_steps_make_no_blocking_copies_and_read_back_only_the_edge_facts(tool, result, tmp_path):
    js = tmp_path / "c.json"
    tool("count_step_ops", "--layers", ",".join(LAYERS), "--routes", "exact,static", "--dtypes", "float32,bfloat16",
         "--targets", "120", "--json", js, "--markdown", "")
    rows = result(js, "count_step_ops")["rows"]
    assert len(rows) == len(LAYERS) * 2 * 2
    for r in rows:
        assert r["blocking_copies"] == 0, r
        # a step on a new graph: the exact route's one read is the graph's edge facts
        assert r["syncs"] == (0 if r["route"] == "static" else 1), r
        if r["route"] == "exact":
            assert r["kernels"].get("edge_facts") == 1, r
