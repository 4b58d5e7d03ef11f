"""DGL shims (installed as ``gnn_fastpath.integrations.dgl``)."""
