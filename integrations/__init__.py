"""Framework shims, installed as ``gnn_fastpath.integrations`` (never top-level).

Each framework's package (``dgl``, ``pyg``) imports the core by absolute name
(``gnn_fastpath.ops``, ``gnn_fastpath.graph``) and registers itself with the core when it is
imported (:mod:`gnn_fastpath.registry`): its shims, loaded by ``gnn_fastpath.enable()``, and
its graph adapter for :meth:`gnn_fastpath.Graph.of`. The core never imports these packages;
it loads them by name. They import no framework at import time.
"""
