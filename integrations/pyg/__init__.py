"""PyTorch Geometric shims (installed as ``gnn_fastpath.integrations.pyg``)."""


def shims():
    """The PyG shims, or [] when torch_geometric is not importable."""
    try:
        import torch_geometric  # noqa: F401
    except (ImportError, OSError):  # not installed, or a build that cannot load here
        return []
    from .layers import SHIMS

    return list(SHIMS)
