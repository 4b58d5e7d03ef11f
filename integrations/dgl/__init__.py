"""DGL shims (installed as ``gnn_fastpath.integrations.dgl``)."""


def shims():
    """The DGL shims, or [] when DGL is not importable."""
    try:
        import dgl  # noqa: F401
    except (ImportError, OSError):  # not installed, or a build that cannot load here
        return []
    from .layers import SHIMS

    return list(SHIMS)
