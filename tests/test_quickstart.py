"""examples/quickstart.py (the README's first command) gives a verdict, on the CPU.

Each run uses a small synthetic graph and ``--device cpu``, so the layers run on the reference
ops whatever the machine. The quickstart is imported by path and its ``main(argv)`` called,
except for one run through ``sys.executable`` that checks the script's exit code end to end.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "examples", "quickstart.py")
YES = "verdict: matches stock within rtol 1e-05: yes"
NO = "verdict: matches stock within rtol 1e-05: no"
REFERENCE = "ran:     reference ops (pure PyTorch, cpu='reference')"
CAVEAT = ("timings on CPU compare the pure-PyTorch reference with stock PyG/DGL and mean "
          "nothing about the GPU kernels")


@pytest.fixture(scope="module")
def quickstart():
    spec = importlib.util.spec_from_file_location("_gnn_fastpath_quickstart", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(autouse=True)
def _switch_off():
    import gnn_fastpath

    gnn_fastpath.disable()
    yield
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()


def _layers(out: str) -> int:
    return out.count("\n  verdict: ")


def _run(quickstart, capsys, *argv):
    code = quickstart.main(["--device", "cpu", "--nodes", "300", *argv])
    return code, capsys.readouterr().out


def test_cpu_run_matches_with_reference_ops(pyg, quickstart, capsys):
    code, out = _run(quickstart, capsys)
    assert code == 0, out
    layers = _layers(out)
    assert layers >= 3  # the three PyG layers, two more with DGL
    assert out.count(YES) == layers, out
    assert out.count(REFERENCE) == layers, out
    assert "fused CUDA kernels" not in out
    assert "fallback" not in out
    assert CAVEAT in out
    assert out.count("(CPU: not meaningful") == layers + 1  # every layer and the ops table
    assert "speedup" not in out
    assert "Data: synthetic graph (seeded random, 300 nodes" in out
    assert f"Verdict: all {layers} layers match stock within tolerance ({layers} ran reference ops" in out


def test_broken_comparison_says_no_and_fails(pyg, quickstart, capsys, monkeypatch):
    monkeypatch.setattr(quickstart, "PERTURB", 1e-3)  # enabled outputs scaled by 1.001
    code, out = _run(quickstart, capsys)
    assert code == 1, out
    layers = _layers(out)
    assert out.count(NO) == layers, out
    assert YES not in out
    assert f"Verdict: {layers} of {layers} layers do NOT match stock: PyG GATv2Conv" in out
    # the error the perturbation makes, in the output and the gradients alike
    assert out.count("  error:   output 1.0e-03, input grad 1.0e-03, parameter grads <= 1.0e-03") == layers, out


def test_zero_tolerance_is_reported(pyg, quickstart, capsys, monkeypatch):
    monkeypatch.setitem(quickstart.TOLERANCE, "cpu", 0.0)
    code, out = _run(quickstart, capsys)
    assert "verdict: matches stock within rtol 0e+00: " in out
    assert (code == 1) == ("within rtol 0e+00: no" in out)


def test_missing_real_graph_falls_back_loudly(pyg, tmp_path):
    env = dict(os.environ, GNN_FASTPATH_DATA=str(tmp_path), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, SCRIPT, "--graph", "tolokers", "--device", "cpu", "--nodes", "200"],
                          capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "tolokers NOT FOUND" in out
    assert str(tmp_path / "heterophilous" / "tolokers.npz") in out
    assert "falling back to a synthetic graph of 200 nodes" in out
    assert "Graph: 200 nodes" in out
    layers = _layers(out)
    assert layers >= 3 and out.count(YES) == layers and out.count(REFERENCE) == layers, out
    assert CAVEAT in out
    assert "Verdict: all" in out


def test_real_graph_is_named(pyg, quickstart, capsys, monkeypatch, tmp_path):
    folder = tmp_path / "heterophilous"
    folder.mkdir()
    rng = np.random.default_rng(0)
    np.savez(folder / "tolokers.npz", edges=rng.integers(0, 150, (600, 2)))
    monkeypatch.setenv("GNN_FASTPATH_DATA", str(tmp_path))
    code, out = _run(quickstart, capsys, "--graph", "tolokers")
    assert code == 0, out
    assert f"Data: tolokers (real graph), read from {folder / 'tolokers.npz'}" in out
    assert "NOT FOUND" not in out


def test_path_descriptions(quickstart):
    describe = quickstart.describe_path
    fused = {"pyg.GATv2Conv": {"fused": {"cuda": 2, "reference": 0}, "fallback": {}}}
    assert describe(fused, {}) == "fused CUDA kernels"
    ref = {"pyg.GATv2Conv": {"fused": {"cuda": 0, "reference": 2}, "fallback": {}}}
    assert describe(ref, {}) == "reference ops (pure PyTorch, cpu='reference')"
    stock = {"pyg.GATv2Conv": {"fused": {"cuda": 0, "reference": 0}, "fallback": {"cpu": 2}}}
    assert describe(stock, {"cpu": "CPU tensors run stock code"}) == \
        "stock (fallback: cpu: CPU tensors run stock code)"
    assert describe({}, {}).startswith("stock (fallback: not intercepted")
