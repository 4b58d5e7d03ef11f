"""The benchmark tools run as commands: ``tool(name, *args)`` runs ``python -m
benchmarks.<name> ...`` from the repository root with no GPU visible (the tools' CPU smoke
paths), one thread, and the graph cache in the test's tmp_path. The few pieces tested in
process (``benchmarks.dry``, ``bench_host.measure``) import from the repository root, which
this file puts on ``sys.path`` (the package is not installed; without the root there, the
name ``benchmarks`` would find this test folder)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))


@pytest.fixture
def tool(tmp_path):
    env = dict(os.environ, GNN_FASTPATH_BENCH_CACHE=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))

    def run(name, *args, expect=0, timeout=600):
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *map(str, args)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == expect, (f"benchmarks.{name} exited {proc.returncode}\n--- stdout\n"
                                           f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
        return proc

    return run


@pytest.fixture
def result():
    """``result(path, benchmark)``: a result JSON file, checked for what every one records about
    where it was measured."""

    def load(path, benchmark):
        payload = json.loads(Path(path).read_text())
        assert payload["benchmark"] == benchmark
        env = payload["environment"]
        for key in ("timestamp_utc", "git_commit", "gpu", "torch", "torch_geometric", "python", "gnn_fastpath_env"):
            assert key in env, key
        assert isinstance(payload["rows"], list) and isinstance(payload["settings"], dict)
        return payload

    return load
