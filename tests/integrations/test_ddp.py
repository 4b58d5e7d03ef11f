"""Data-parallel training with gnn_fastpath: ``examples/pyg_ddp.py`` under ``torchrun``.

Each test launches the example with ``python -m torch.distributed.run --standalone
--nproc-per-node 2`` (two processes on this host, a free rendezvous port), once with stock
layers (``--no-fastpath``) and once with ``gnn_fastpath.enable()``, on a tiny arxiv-like graph
for a few steps without dropout, and reads the record rank 0 writes (``--json``). It checks:

- every rank ran its layers fused (``gnn_fastpath.stats()`` of each rank, gathered with
  ``all_gather_object``: fused calls on the expected backend, no fallback), and the stock run
  ran nothing through the shims;
- DDP kept the parameters bit-identical on every rank (sha256 of each rank's parameters);
- the ranks trained on different shards (their losses differ) and the enabled run's per-step
  losses of every rank match the stock run's within float tolerance, which needs both runs
  to draw the same mini-batches (the example's sampler runs in a random stream of its own:
  :func:`test_sampling_is_reproducible` shows the batches depend on the seed only).

CPU (gloo, ``--device cpu``, the shims on the reference ops) in CI, within a minute; the
same on two GPUs with NCCL under the ``cuda`` marker. PyG's ``NeighborLoader`` samples with
pyg-lib or torch-sparse, or else with the tests' pure-torch sampler (tests/pyg_sampler_shim.py,
which the session carries into the torchrun processes).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "examples", "pyg_ddp.py")
STEPS = 4
LAYERS = 3
TINY = ["--dataset", "arxiv-like", "--scale", "0.01", "--features", "16", "--classes", "4", "--hidden", "8",
        "--heads", "2", "--batch-size", "64", "--fanouts", "5,4,3", "--steps", str(STEPS), "--dropout", "0",
        "--attn-dropout", "0", "--eval-nodes", "128", "--quiet", "--seed", "0"]


@pytest.fixture(scope="module")
def sampler(pyg):
    """Skips unless PyG's NeighborLoader has a sampler backend (torch-sparse or pyg-lib)."""
    import torch_geometric.typing as typing

    if not (typing.WITH_TORCH_SPARSE or typing.WITH_PYG_LIB):
        pytest.skip("NeighborLoader needs torch-sparse or pyg-lib; neither imports here")
    return "pyg-lib" if typing.WITH_PYG_LIB else "torch-sparse"


def _torchrun(out_dir, name: str, *args: str, timeout: float):
    """Run the example on two local processes; (rank 0's JSON record, stdout)."""
    record = out_dir / f"{name}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT,
           *TINY, "--json", str(record), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", GNN_FASTPATH_BENCH_CACHE=str(out_dir / "graphs"))
    env.pop("GNN_FASTPATH", None)  # GNN_FASTPATH=0 would turn enable() into a no-op
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 0, (f"{' '.join(cmd)}\n--- stdout\n{proc.stdout[-6000:]}\n"
                                  f"--- stderr\n{proc.stderr[-6000:]}")
    with open(record) as f:
        return json.load(f), proc.stdout


def _check_runs(stock, fused, backend: str, rtol: float, atol: float) -> None:
    for run in (stock, fused):
        assert run["world_size"] == 2
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        assert all(r["steps"] == STEPS for r in run["ranks"]), [r["steps"] for r in run["ranks"]]
        # DDP: every rank ends with the same parameters, bit for bit
        assert len({r["param_sha256"] for r in run["ranks"]}) == 1, [r["param_sha256"] for r in run["ranks"]]
        assert run["params_identical"] is True
        # each rank trained on its own shard
        assert run["losses"][0] != run["losses"][1]
    assert fused["fastpath"] is True
    assert stock["fastpath"] is False
    for r in stock["ranks"]:
        assert r["stats"] == {}, r["stats"]  # nothing patched: stock layers all the way
    for r in fused["ranks"]:
        assert r["fallback_calls"] == 0, (r["rank"], r["stats"])
        for key, entry in r["stats"].items():
            assert entry["fallback"] == {}, (r["rank"], key, entry)
        fused_on = sum(e["fused"][backend] for e in r["stats"].values())
        assert fused_on >= STEPS * LAYERS, (r["rank"], r["stats"])  # training calls (+ evaluation)
        assert fused_on == r["fused_calls"], (r["rank"], r["stats"])  # nothing on the other backend
    for rank in (0, 1):
        np.testing.assert_allclose(fused["losses"][rank], stock["losses"][rank], rtol=rtol, atol=atol,
                                   err_msg=f"per-step losses of rank {rank}: enabled vs stock")
    # (parameters are not compared between the runs: Adam turns a gradient that is float noise
    # on both paths, e.g. of a key bias under a softmax, into a full-size step of either sign)


# --------------------------------------------------------------------------- CPU (gloo)
# Two layers of different op families (attention, segment reduction), about 6 s per torchrun
# run on a 2-core box; GCN and TransformerConv run the same way (their shims are covered by
# tests/integrations/pyg and the GPU test below).
@pytest.mark.parametrize("layer", ["gatv2", "sage_max"])
def test_cpu_ddp_two_processes_match_stock(sampler, tmp_path, layer):
    stock, _ = _torchrun(tmp_path, "stock", "--device", "cpu", "--layer", layer, "--no-fastpath", timeout=120)
    fused, stdout = _torchrun(tmp_path, "fused", "--device", "cpu", "--layer", layer, timeout=120)
    assert fused["backend"] == "gloo" and stock["backend"] == "gloo"
    assert all(r["device"] == "cpu" for r in fused["ranks"])
    _check_runs(stock, fused, "reference", rtol=1e-4, atol=1e-6)
    assert "parameters identical on every rank: yes" in stdout
    assert "test accuracy" in stdout


def test_sampling_is_reproducible(sampler):
    """The example's batches depend on (seed, rank) only: the same with or without random
    draws of the model in between (dropout, the fused path's own attention dropout)."""
    spec = importlib.util.spec_from_file_location("_gnn_fastpath_pyg_ddp", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = example.parse_args(TINY)
    data, train_idx, _, _, _ = example.load_data(args)
    ids = example.shard(train_idx, 1, 2, args.seed, equal=True)

    def batches(seed: int, draw_between: bool):
        loader = example._loader(data, ids, args, shuffle=True, batch_size=args.batch_size)
        stream = example.RngStream(seed)
        seen = []
        with stream:
            it = iter(loader)
        while True:
            with stream:
                batch = next(it, None)
            if batch is None:
                return seen
            seen.append((batch.n_id.clone(), batch.edge_index.clone()))
            if draw_between:
                torch.rand(1000)  # the model's draws on the global CPU generator

    torch.manual_seed(0)
    first = batches(5, draw_between=False)
    torch.manual_seed(123)
    second = batches(5, draw_between=True)
    other = batches(6, draw_between=False)
    assert len(first) == len(second) > 1
    for (n1, e1), (n2, e2) in zip(first, second):
        assert torch.equal(n1, n2) and torch.equal(e1, e2)
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(first, other))  # another seed: other batches


def test_sampler_follows_torch_manual_seed(sampler):
    """What makes the stream above work: PyG's neighbour sampler (torch-sparse's
    ``neighbor_sample`` or pyg-lib's) draws from torch's global CPU generator."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 500, (2, 6000), generator=gen)
    data = Data(x=torch.arange(500).float()[:, None], edge_index=edge_index, num_nodes=500)

    def sample(seed):
        torch.manual_seed(seed)
        loader = NeighborLoader(data, num_neighbors=[3, 2], input_nodes=torch.arange(64), batch_size=64)
        batch = next(iter(loader))  # no shuffle: only the sampler draws
        return batch.n_id, batch.edge_index

    a, b, c = sample(0), sample(0), sample(1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


# --------------------------------------------------------------------------- GPUs (nccl)
@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (one process per GPU, NCCL)")
@pytest.mark.parametrize("layer", ["gatv2", "transformer", "gcn", "sage_max"])
def test_gpu_ddp_two_gpus_match_stock(sampler, tmp_path, layer):
    stock, _ = _torchrun(tmp_path, "stock", "--device", "cuda", "--layer", layer, "--no-fastpath", timeout=300)
    fused, stdout = _torchrun(tmp_path, "fused", "--device", "cuda", "--layer", layer, timeout=300)
    assert fused["backend"] == "nccl" and stock["backend"] == "nccl"
    assert [r["device"] for r in fused["ranks"]] == ["cuda:0", "cuda:1"]
    _check_runs(stock, fused, "cuda", rtol=1e-3, atol=1e-5)
    assert "parameters identical on every rank: yes" in stdout
