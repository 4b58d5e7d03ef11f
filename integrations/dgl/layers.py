"""The DGL shims: ``SHIMS`` lists one :class:`~gnn_fastpath.integrations.shim.Shim` per layer.

Imported only once ``import dgl`` has succeeded (see ``__init__.shims``).
"""
from __future__ import annotations

from typing import List

from ..shim import Shim
from .agnn_conv import make_shim as _agnn_conv
from .edge_conv import make_shim as _edge_conv
from .gat_conv import make_shim as _gat_conv
from .gatv2_conv import make_shim as _gatv2_conv
from .gin_conv import make_shim as _gin_conv
from .graph_conv import make_shim as _graph_conv
from .sage_conv import make_shim as _sage_conv

SHIMS: List[Shim] = [_gatv2_conv(), _gat_conv(), _graph_conv(), _sage_conv(), _agnn_conv(), _gin_conv(),
                     _edge_conv()]
