"""Framework shims, installed as ``gnn_fastpath.integrations`` (never top-level)."""
