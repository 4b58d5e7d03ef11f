"""Import behaviour: the package needs only torch and numpy, and installs no top-level names.

Each check runs in a fresh interpreter so that modules already imported by the test
session (DGL, PyG) cannot mask a missing or eager import. One child per situation, each
reporting several facts as JSON, keeps this file fast.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FRAMEWORKS = ("cupy", "dgl", "torch_geometric")

# Executed first in the child: a None entry in sys.modules makes `import name` (and
# `import name.sub`) raise ImportError, as if the package were not installed.
BLOCK = "import sys\nfor _name in {names!r}:\n    sys.modules[_name] = None\n"

# Runs each named step, recording its JSON-able result or the exception it raised.
STEPS = """
import json, traceback
_results = {}
def step(name, fn):
    try:
        _results[name] = {"ok": True, "value": fn()}
    except BaseException:
        _results[name] = {"ok": False, "error": traceback.format_exc()}
"""


def _child(code, *, cwd, block=(), drop_pythonpath=False):
    env = dict(os.environ)
    env.pop("GNN_FASTPATH_DISABLE_CUDA", None)
    if drop_pythonpath:
        env.pop("PYTHONPATH", None)
    prefix = BLOCK.format(names=tuple(block)) if block else ""
    src = prefix + STEPS + textwrap.dedent(code) + "\nprint(json.dumps(_results))\n"
    proc = subprocess.run([sys.executable, "-c", src], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, f"child failed:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _value(results, name):
    res = results[name]
    assert res["ok"], f"step {name!r} raised:\n{res['error']}"
    return res["value"]


# ---------------------------------------------------------------------------- frameworks made unimportable
@pytest.fixture(scope="module")
def blocked():
    return _child("""
        def _import():
            import gnn_fastpath
            from gnn_fastpath import Graph, cuda, ops, reference  # noqa: F401
            still = []
            for name in ("cupy", "dgl", "torch_geometric"):
                try:
                    __import__(name)
                    still.append(name)
                except ImportError:
                    pass
            return {"available": cuda.available(), "reason": cuda.unavailable_reason(),
                    "importable": still, "version": gnn_fastpath.__version__}

        def _ops():
            import torch
            import gnn_fastpath as gf
            g = gf.Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]))
            x = torch.randn(3, 2, 4)
            out = gf.gatv2_attention(g, x, x, torch.randn(2, 4))
            dot = gf.dot_attention(g, x, x, x)
            s = gf.spmm(g, torch.randn(3, 5), norm="both")
            r = gf.segment_reduce(g, torch.randn(3, 5), "max")
            return [list(t.shape) for t in (out, dot, s, r)]

        def _integrations():
            import gnn_fastpath.integrations.pyg as p
            import gnn_fastpath.integrations.dgl as d
            return [p.__name__, d.__name__]

        def _mapped():
            # gnn_fastpath.integrations exists only once installed (pyproject's package-dir
            # maps the top-level integrations/ folder there); a bare checkout lacks it.
            import importlib.util
            return importlib.util.find_spec("gnn_fastpath.integrations") is not None

        step("import", _import)
        step("ops", _ops)
        step("mapped", _mapped)
        step("integrations", _integrations)
    """, cwd=REPO_ROOT, block=FRAMEWORKS)


def test_import_without_cupy_dgl_pyg(blocked):
    res = _value(blocked, "import")
    assert res["importable"] == []  # the blocking trick really worked
    assert res["available"] is False
    assert isinstance(res["reason"], str) and res["reason"].strip()
    assert res["version"]


def test_reference_ops_work_without_frameworks(blocked):
    assert _value(blocked, "ops") == [[3, 2, 4], [3, 2, 4], [3, 5], [3, 5]]


def test_integrations_import_without_frameworks(blocked):
    if not _value(blocked, "mapped"):
        pytest.skip("gnn_fastpath.integrations exists only in an installed package (pip install -e .)")
    assert _value(blocked, "integrations") == ["gnn_fastpath.integrations.pyg", "gnn_fastpath.integrations.dgl"]


# ---------------------------------------------------------------------------- installed layout, eager imports
@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """Facts seen from a directory away from the checkout, without PYTHONPATH.

    When the package is not installed (a bare checkout), the checkout is put on sys.path
    after the layout facts are taken, so the eager-import check still runs.
    """
    return _child(f"""
        import importlib.util, sys
        step("installed", lambda: importlib.util.find_spec("gnn_fastpath") is not None)
        step("top_level", lambda: importlib.util.find_spec("integrations") is not None)
        if not _results["installed"]["value"]:
            sys.path.append({REPO_ROOT!r})

        def _loaded():
            import gnn_fastpath
            gnn_fastpath.cuda.available()
            return [m for m in ("cupy", "dgl", "torch_geometric") if m in sys.modules]

        def _integrations():
            import gnn_fastpath.integrations
            import gnn_fastpath.integrations.pyg as p
            import gnn_fastpath.integrations.dgl as d
            return [p.__name__, d.__name__]

        step("loaded", _loaded)
        step("integrations", _integrations)
    """, cwd=str(tmp_path_factory.mktemp("elsewhere")), drop_pythonpath=True)


def test_import_does_not_load_optional_frameworks(outside):
    # cupy may legitimately be imported by available() on a GPU machine; DGL and PyG never
    assert [m for m in _value(outside, "loaded") if m != "cupy"] == []


def _require_installed(outside):
    if not _value(outside, "installed"):
        pytest.skip("gnn_fastpath is not installed (only importable from the checkout)")


def test_no_top_level_integrations_package(outside):
    _require_installed(outside)
    assert _value(outside, "top_level") is False


def test_installed_integrations_import(outside):
    _require_installed(outside)
    assert _value(outside, "integrations") == ["gnn_fastpath.integrations.pyg", "gnn_fastpath.integrations.dgl"]
