"""PyTorch Geometric shims (installed as ``gnn_fastpath.integrations.pyg``).

:func:`shims` never swallows the error of ``import torch_geometric``: it raises it unchanged,
and :func:`not_installed` tells the two cases apart for :func:`gnn_fastpath.enable`, which
skips a framework that is not installed silently and reports one that is installed but broken.
"""

#: The top-level package this integration patches.
PACKAGE = "torch_geometric"

#: What to install when ``import torch_geometric`` fails (``enable()`` puts it in its error
#: and warning).
INSTALL = ("install PyTorch Geometric for your torch version: `pip install torch_geometric` "
           "(or `pip install -e \".[pyg]\"` in a checkout of gnn_fastpath); see "
           "https://pytorch-geometric.readthedocs.io/en/latest/install/installation.html")


def not_installed(exc: BaseException) -> bool:
    """Whether ``exc``, raised by :func:`shims`, means PyG is not installed at all (a
    ModuleNotFoundError for ``torch_geometric`` itself) rather than installed but failing to
    import."""
    return isinstance(exc, ModuleNotFoundError) and exc.name == PACKAGE


def shims():
    """The PyG shims (one per patched layer class).

    Raises what ``import torch_geometric`` raises, unchanged: a ModuleNotFoundError for
    ``torch_geometric`` itself when PyG is not installed (:func:`not_installed`), or the
    ImportError/OSError of an installed PyG that cannot be imported here.
    """
    import torch_geometric  # noqa: F401

    from .layers import SHIMS

    return list(SHIMS)
