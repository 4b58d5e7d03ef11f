"""PyTorch Geometric shims (installed as ``gnn_fastpath.integrations.pyg``)."""
