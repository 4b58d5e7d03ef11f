"""Run one Python script as ``__main__``, stock or after ``gnn_fastpath.enable()``: the child
process of :mod:`benchmarks.bench_pyg_examples`.

    python -m benchmarks.pyg_example_run stock|enabled SCRIPT [ARGS...]

The script runs unchanged, with ``sys.argv`` = ``[SCRIPT, ARGS...]`` and its own folder first on
``sys.path`` (as ``python SCRIPT`` would have it). With ``enabled`` the plugin is switched on
before the script imports anything, exactly as a user adds the one line at the top; afterwards
``stats()`` is printed as one line ``GNN_FASTPATH_STATS <json>`` for the parent to read.
"""
from __future__ import annotations

import json
import os
import runpy
import sys

STATS_TAG = "GNN_FASTPATH_STATS"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] not in ("stock", "enabled"):
        raise SystemExit("usage: python -m benchmarks.pyg_example_run stock|enabled SCRIPT [ARGS...]")
    mode, script = argv[0], os.path.abspath(argv[1])
    if mode == "enabled":
        import gnn_fastpath

        gnn_fastpath.enable()
    sys.argv = [script] + argv[2:]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
    if mode == "enabled":
        import gnn_fastpath

        print(f"{STATS_TAG} {json.dumps(gnn_fastpath.stats(), default=str)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
