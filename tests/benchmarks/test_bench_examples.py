"""The small-graph benchmark (PyG-example-shaped epochs, size sweep) as a command on the CPU."""


def test_examples_and_sweep(tool, result, tmp_path):
    js, md = tmp_path / "examples.json", tmp_path / "examples.md"
    tool("bench_examples", "--device", "cpu", "--examples", "gcn,gat", "--epochs", "2", "--warmup", "1",
         "--seeds", "0", "--layers", "gcn,gatv2", "--nodes", "100,300", "--steps", "2", "--json", js, "--markdown", md)
    payload = result(js, "examples")
    rows = payload["rows"]
    assert [(r["example"], r["seed"]) for r in rows] == [("gcn", 0), ("gat", 0)]
    for r in rows:
        assert r["status"] == "ok" and r["stock_ms_per_epoch"] > 0 and r["enabled_ms_per_epoch"] > 0, r
        assert abs(r["speedup"] - r["stock_ms_per_epoch"] / r["enabled_ms_per_epoch"]) < 1e-9
        assert r["verdict"] == ("slower" if r["speedup"] < 1 else "no slower")
        for mode in ("stock", "enabled"):
            assert all(0.0 <= r[f"{mode}_{k}"] <= 1.0 for k in ("train_acc", "val_acc", "test_acc"))
        layer = {"gcn": "pyg.GCNConv", "gat": "pyg.GATConv"}[r["example"]]
        # the enabled run went through the shims (the CPU reference ops), every call
        assert r["enabled_fused_path"].startswith(f"{layer}: reference ") and "fallback" not in r["enabled_fused_path"]
        assert r["stock_fused_path"] is None
    # cached=True GCN: the deterministic model gives the same accuracies either way
    gcn = rows[0]
    assert (gcn["stock_train_acc"], gcn["stock_test_acc"]) == (gcn["enabled_train_acc"], gcn["enabled_test_acc"])
    sweep = payload["sweep"]
    assert [(r["layer"], r["nodes"]) for r in sweep] == [("gcn", 100), ("gcn", 300), ("gatv2", 100), ("gatv2", 300)]
    for layer in ("gcn", "gatv2"):
        mine = sorted((r for r in sweep if r["layer"] == layer), key=lambda r: r["nodes"])
        assert all(r["edges"] == 8 * r["nodes"] and r["stock_ms"] > 0 and r["enabled_ms"] > 0 for r in mine)
        # the crossover: the smallest size from which no larger one is slower
        want = None
        for r in reversed(mine):
            if r["speedup"] < 1.0:
                break
            want = r["nodes"]
        assert payload["crossover_nodes"][layer] == want
    text = md.read_text()
    assert "| cora | gcn | 0 |" in text and "Crossover" in text
