"""gnn_fastpath.stats: counters a hot path increments itself (fallback_cell) next to the locked ones."""
import importlib

# the module (the package's name ``stats`` is its function)
stats = importlib.import_module("gnn_fastpath.stats")


def test_a_fallback_cell_counts_into_stats_and_resets():
    stats.reset_stats()
    cell = stats.fallback_cell("test.Layer", "small_graph")
    assert stats.fallback_cell("test.Layer", "small_graph") is cell  # one counter per (layer, reason)
    assert "test.Layer" not in stats.stats()  # listed once it counts
    cell[0] += 2
    stats.record_fallback("test.Layer", "small_graph", warn=False)
    stats.record_fallback("test.Layer", "hooks", warn=False)
    entry = stats.stats()["test.Layer"]
    assert entry["fallback"] == {"small_graph": 3, "hooks": 1}
    assert entry["fused"] == {"cuda": 0, "reference": 0}
    stats.reset_stats()
    assert cell[0] == 2 and "test.Layer" not in stats.stats()  # the baseline moves, the count is not written
    cell[0] += 1  # the cell outlives the reset (a memo holds it) and counts again
    assert stats.stats()["test.Layer"]["fallback"] == {"small_graph": 1}
    stats.reset_stats()
