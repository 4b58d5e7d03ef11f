"""Data-parallel mini-batch training of a PyG model on several GPUs (or CPU processes) with
``torch.nn.parallel.DistributedDataParallel``, stock or through gnn_fastpath.

Launch one process per GPU with ``torchrun``:

    torchrun --nproc-per-node 2 examples/pyg_ddp.py                      # arxiv-like, GATv2, fused
    torchrun --nproc-per-node 2 examples/pyg_ddp.py --no-fastpath        # stock PyG, same batches
    torchrun --nproc-per-node 2 examples/pyg_ddp.py --layer transformer --epochs 3 --json run.json
    torchrun --nproc-per-node 2 examples/pyg_ddp.py --device cpu --scale 1   # the full graph on CPUs (slow)
    # several hosts: the same command on each, with their own --node-rank
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 examples/pyg_ddp.py

Run without ``torchrun`` it trains in one process (world size 1). Nothing here assumes a
single node: the rank, the local rank (which GPU of this host) and the world size come
from the environment torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``).

What each process does
----------------------
* ``gnn_fastpath.enable()`` (unless ``--no-fastpath``): every process patches its own PyG
  classes; on the CPU ``enable(cpu="reference")``, so the shims run on the pure-PyTorch
  reference ops (a correctness path, not a fast one).
* Process group: ``nccl`` on CUDA (GPU ``LOCAL_RANK``), ``gloo`` on the CPU (``--device
  cpu``). NCCL's NVLink multicast (NVLS) is switched off with
  ``os.environ.setdefault("NCCL_NVLS_ENABLE", "0")`` before the group is created: the GPU
  machines this project runs on must keep it off (set the variable yourself to override).
* Data: every process builds the same seeded graph (``--dataset arxiv-like`` and the other
  synthetic graphs of ``benchmarks/graphs.py``, ``--scale`` to shrink them: by default 1 on
  CUDA and ``_common.CPU_SCALE`` on the CPU, where the full graph takes many minutes per
  epoch; with seeded features whose classes can be learnt; or
  ``cora``/``citeseer``/``tolokers``/``synthetic`` of ``examples/_common.py``). The training
  ids are shuffled with the seed, cut to a multiple of the world size and split into one
  equal shard per rank (``tensor_split``), so every rank runs the same number of steps (DDP
  needs that: an extra step on one rank would wait for the others' gradients forever).
* Each rank runs a PyG ``NeighborLoader`` (fan-outs ``--fanouts 15,10,5``, ``--batch-size
  1024``, shuffled) over its shard; the model has one layer per fan-out (``--layer gatv2``:
  ``GATv2Conv(d, 64, heads=4)``, ``transformer``: ``TransformerConv(d, 64, heads=4)``,
  ``gcn``: ``GCNConv(d, 64, cached=False)``, ``sage_max``: ``SAGEConv(d, 64, aggr="max")``;
  the last layer maps to the classes, one head), ELU and ``--dropout`` between layers,
  ``--attn-dropout`` inside the attention layers. The loss is taken on the batch's seed nodes.
* Progress: rank 0 prints a line as soon as it starts (before the imports and the process
  group), then about ten lines per epoch (step, mean loss, median step time) and one per epoch.
* At the end: test accuracy (sampled inference over each rank's share of the test ids,
  counts summed over ranks), and per rank the median step time (sampling, copy to the
  device, forward, backward with DDP's all-reduce, optimizer), its sampling part and its
  model part (from the copy on; the ranks meet at a barrier after sampling, so a rank's model
  step does not include waiting for another rank's sampler), the fused/fallback counts of
  ``gnn_fastpath.stats()`` (gathered with ``all_gather_object``) and a checksum of its
  parameters (DDP keeps them bit-identical on every rank). Rank 0 prints them and, with
  ``--json PATH``, writes them with every rank's per-step losses.

Reproducible sampling
---------------------
A stock run and a fused run with the same ``--seed`` see the same mini-batches. The loader's
shuffle and the neighbour sampler both draw from torch's global CPU generator: torch-sparse
0.6.18's ``neighbor_sample`` (PyG's sampler when pyg-lib is absent) draws every neighbour with
``torch::randint`` on the default generator, so it follows ``torch.manual_seed`` (checked:
same seed, same batches; ``tests/integrations/test_ddp.py`` checks whichever sampler is
installed, pyg-lib included). Anything the model draws on the CPU (dropout, on the CPU
backend) comes from that generator too, so the loader runs in a CPU random stream of its own
(:class:`RngStream`: its state is swapped in around each ``iter(loader)``/``next(batch)``
and swapped out again), seeded by (seed, rank): the batches depend on the seed and the
rank only, not on what the model drew in between. With ``--num-workers N`` each worker is
seeded from that stream when the epoch's iterator is made (PyTorch's ``DataLoader`` rule),
which is reproducible too (other batches than ``--num-workers 0``, the same on every run).
Dropout is seeded per rank. The fused attention layers draw their attention-dropout masks
their own way, so stock and fused runs agree to float precision with ``--attn-dropout 0``
(feature ``--dropout`` draws the same numbers on both paths; checked on the CPU).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

EXAMPLES = os.path.dirname(os.path.abspath(__file__))
# _common comes from examples/; benchmarks/graphs.py is loaded by path (_common._bench_graphs), which
# keeps the repository root off sys.path, where it would shadow an installed gnn_fastpath.
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

from _common import (DATASETS, _bench_graphs, default_scale, enable_fastpath, import_pyg,  # noqa: E402
                     load_node_data)

LAYERS = ("gatv2", "transformer", "gcn", "sage_max")


# --------------------------------------------------------------------------- arguments
def _synthetic_names() -> Tuple[str, ...]:
    return tuple(_bench_graphs().SYNTHETIC)


def _fanouts(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"fan-outs must be comma-separated integers, got {text!r}") from None
    if not values or any(v == 0 or v < -1 for v in values):
        raise argparse.ArgumentTypeError(f"fan-outs must be positive (or -1: all neighbours), got {text!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="arxiv-like", choices=_synthetic_names() + DATASETS,
                        help="a synthetic graph of benchmarks/graphs.py (default arxiv-like) or a dataset of "
                             "examples/_common.py")
    parser.add_argument("--scale", type=float, default=None,
                        help="fraction of the nodes and edges of a benchmarks/graphs.py graph (0 < scale <= 1); "
                             "default 1 on cuda, a CPU size on cpu")
    parser.add_argument("--data", default=None, help="data file or folder for cora/citeseer/tolokers")
    parser.add_argument("--features", type=int, default=128, help="feature width of a synthetic graph")
    parser.add_argument("--classes", type=int, default=40, help="classes of a synthetic graph")
    parser.add_argument("--train-frac", type=float, default=0.5,
                        help="training fraction of a benchmarks/graphs.py graph (the rest is test)")
    parser.add_argument("--layer", choices=LAYERS, default="gatv2")
    parser.add_argument("--hidden", type=int, default=64, help="channels (per head) of the hidden layers")
    parser.add_argument("--heads", type=int, default=4, help="heads of the hidden attention layers")
    parser.add_argument("--fanouts", type=_fanouts, default=[15, 10, 5],
                        help="neighbours sampled per layer, comma-separated; one layer each (default 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=1024, help="seed nodes per rank and step")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run every epoch)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--dropout", type=float, default=0.5, help="feature dropout between layers")
    parser.add_argument("--attn-dropout", type=float, default=0.0,
                        help="dropout on attention coefficients (gatv2, transformer)")
    parser.add_argument("--eval-nodes", type=int, default=0,
                        help="test nodes evaluated in all (0: every test node; -1: no evaluation)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda: GPU LOCAL_RANK of this host, nccl; cpu: gloo")
    parser.add_argument("--backend", default=None, help="process-group backend (default nccl on cuda, gloo on cpu)")
    parser.add_argument("--fastpath", action=argparse.BooleanOptionalAction, default=True,
                        help="gnn_fastpath.enable() (default) or stock layers (--no-fastpath)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="rank 0 writes the run's record here")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")
    return args


# --------------------------------------------------------------------------- process group
def init_distributed(args) -> Tuple[int, int, int, torch.device, str]:
    """(rank, local rank, world size, device, backend); creates the process group.

    Without torchrun's variables it runs as a world of one on this host.
    """
    if "RANK" not in os.environ:  # plain `python examples/pyg_ddp.py`
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda, but torch sees no GPU: use --device cpu")
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(f"LOCAL_RANK {local_rank} but this host has {torch.cuda.device_count()} GPUs: "
                             "start at most one process per GPU (--nproc-per-node)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off on these machines
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, rank=rank, world_size=world, **kwargs)
    return rank, local_rank, world, device, backend


# --------------------------------------------------------------------------- random streams
class RngStream:
    """A CPU random stream of its own for torch's global generator.

    Code run inside ``with stream:`` draws from this stream (the generator's state is
    swapped in on entry and saved back on exit), and the state the rest of the program sees
    is restored on exit. Only the CPU generator is touched.
    """

    def __init__(self, seed: int):
        self.state = torch.Generator().manual_seed(seed).get_state()
        self._outer: Optional[torch.Tensor] = None

    def __enter__(self):
        self._outer = torch.get_rng_state()
        torch.set_rng_state(self.state)
        return self

    def __exit__(self, *exc):
        self.state = torch.get_rng_state()
        torch.set_rng_state(self._outer)
        self._outer = None
        return False


def _stream_seed(seed: int, rank: int, purpose: int) -> int:
    return (seed * 1_000_003 + rank * 7_919 + purpose) % (2**63 - 1)


# --------------------------------------------------------------------------- data
def _learnable_features(num_nodes: int, num_features: int, num_classes: int, seed: int):
    """Seeded labels and features that carry them (class centre plus noise)."""
    gen = torch.Generator().manual_seed(seed + 1)
    y = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    centres = torch.randn(num_classes, num_features, generator=gen)
    x = centres[y] * 0.5 + torch.randn(num_nodes, num_features, generator=gen)
    return x, y


def load_data(args):
    """(PyG Data, training ids, test ids, one-line description), the same on every rank."""
    from torch_geometric.data import Data

    if args.dataset in _synthetic_names():
        graph = _bench_graphs().load(args.dataset, seed=args.seed, scale=args.scale)
        n = graph.num_nodes
        x, y = _learnable_features(n, args.features, args.classes, args.seed)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + 2))
        n_train = max(1, int(round(args.train_frac * n)))
        train_idx, test_idx = perm[:n_train], perm[n_train:]
        num_classes = args.classes
        name = f"{args.dataset} (scale {args.scale:g}, seed {args.seed})" if args.scale != 1 else args.dataset
        edge_index = graph.edge_index
    else:
        nd = load_node_data(args.dataset, args.data, args.seed)
        x, y, edge_index, n, num_classes, name = nd.x, nd.y, nd.edge_index, nd.num_nodes, nd.num_classes, nd.name
        train_idx = nd.train_mask.nonzero().flatten()
        test_idx = nd.test_mask.nonzero().flatten()
    data = Data(x=x, y=y, edge_index=edge_index, num_nodes=n)
    text = (f"{name}: {n:,} nodes, {edge_index.size(1):,} edges, {x.size(1)} features, {num_classes} classes, "
            f"{train_idx.numel():,} train / {test_idx.numel():,} test ids")
    return data, train_idx, test_idx, num_classes, text


def shard(ids: torch.Tensor, rank: int, world: int, seed: int, equal: bool) -> torch.Tensor:
    """This rank's part of ``ids`` (shuffled with ``seed`` first, identically on every rank).

    ``equal``: cut to a multiple of ``world`` first, so every rank gets as many ids (and
    steps) as the others.
    """
    ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed + 3))]
    if equal:
        ids = ids[: ids.numel() - ids.numel() % world]
    return ids.tensor_split(world)[rank]


# --------------------------------------------------------------------------- model
class Net(nn.Module):
    """One PyG conv per fan-out; the hidden ones as the brief names them, the last one maps
    to the classes (one head, not concatenated); ELU and dropout between layers."""

    def __init__(self, layer: str, in_channels: int, hidden: int, heads: int, num_classes: int,
                 num_layers: int, dropout: float, attn_dropout: float):
        from torch_geometric.nn import GATv2Conv, GCNConv, SAGEConv, TransformerConv

        super().__init__()
        self.dropout = dropout
        self.convs = nn.ModuleList()
        d = in_channels
        for i in range(num_layers):
            last = i == num_layers - 1
            out = num_classes if last else hidden
            if layer == "gatv2":
                conv = GATv2Conv(d, out, heads=1 if last else heads, concat=not last, dropout=attn_dropout)
                d = out * (1 if last else heads)
            elif layer == "transformer":
                conv = TransformerConv(d, out, heads=1 if last else heads, concat=not last, dropout=attn_dropout)
                d = out * (1 if last else heads)
            elif layer == "gcn":
                conv = GCNConv(d, out, cached=False)
                d = out
            elif layer == "sage_max":
                conv = SAGEConv(d, out, aggr="max")
                d = out
            else:
                raise ValueError(f"unknown layer {layer!r}")
            self.convs.append(conv)

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            if i:
                x = F.dropout(F.elu(x), p=self.dropout, training=self.training)
            x = conv(x, edge_index)
        return x


# --------------------------------------------------------------------------- helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def param_checksum(model: nn.Module) -> Tuple[str, float]:
    """(sha256 of every parameter's bytes in ``named_parameters`` order, float64 sum)."""
    h = hashlib.sha256()
    total = 0.0
    for name, p in model.named_parameters():
        t = p.detach().cpu().contiguous()
        h.update(name.encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
        total += float(t.double().sum())
    return h.hexdigest(), total


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def _counts(stats: Dict) -> Tuple[int, int]:
    """(fused calls on any backend, fallback calls) of a ``gnn_fastpath.stats()``."""
    fused = sum(sum(e["fused"].values()) for e in stats.values())
    fallback = sum(sum(e["fallback"].values()) for e in stats.values())
    return fused, fallback


def _median_ms(values: List[float]) -> float:
    return 1e3 * statistics.median(values) if values else float("nan")


def _loader(data, ids, args, shuffle: bool, batch_size: int):
    from torch_geometric.loader import NeighborLoader

    return NeighborLoader(data, num_neighbors=list(args.fanouts), input_nodes=ids, batch_size=batch_size,
                          shuffle=shuffle, num_workers=args.num_workers,
                          persistent_workers=False)


# --------------------------------------------------------------------------- training
def train(ddp_model, data, train_ids, args, device, rank) -> Dict:
    """Mini-batch training; returns per-step losses and times of this rank."""
    opt = torch.optim.Adam(ddp_model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    loader = _loader(data, train_ids, args, shuffle=True, batch_size=args.batch_size)
    sampler_rng = RngStream(_stream_seed(args.seed, rank, 1))
    losses, step_s, sample_s = [], [], []
    step = 0
    done = False
    report = not args.quiet and rank == 0
    every = max(1, len(loader) // 10)  # about ten progress lines per epoch
    for epoch in range(1, args.epochs + 1):
        ddp_model.train()
        with sampler_rng:
            batches = iter(loader)
        first = len(losses)
        while not done:
            _sync(device)
            t0 = time.perf_counter()
            with sampler_rng:
                batch = next(batches, None)
            if batch is None:
                break
            # the ranks start the model step together: a rank whose sampling ran long would
            # otherwise make the others wait in the gradient all-reduce, inside their model step
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
            t1 = time.perf_counter()
            batch = batch.to(device)
            opt.zero_grad(set_to_none=True)
            out = ddp_model(batch.x, batch.edge_index)[: batch.batch_size]
            loss = F.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
            _sync(device)
            t2 = time.perf_counter()
            losses.append(loss.detach())
            step_s.append(t2 - t0)
            sample_s.append(t1 - t0)
            step += 1
            done = bool(args.steps) and step >= args.steps
            n = len(losses) - first
            if report and (n == 1 or n % every == 0):
                mean = float(torch.stack(losses[first:]).mean())
                print(f"[rank 0] epoch {epoch} step {n}/{len(loader)}: mean loss {mean:.4f}, "
                      f"median step {_median_ms(step_s[first:]):.1f} ms", flush=True)
        if report and len(losses) > first:
            mean = float(torch.stack(losses[first:]).mean())
            print(f"[rank 0] epoch {epoch}: {len(losses) - first} steps, mean loss {mean:.4f}, "
                  f"median step {_median_ms(step_s[first:]):.1f} ms", flush=True)
        if done:
            break
    return {"losses": torch.stack(losses).cpu().tolist() if losses else [], "step_s": step_s, "sample_s": sample_s}


@torch.no_grad()
def evaluate(model, data, test_ids, args, device, rank) -> Tuple[int, int]:
    """(correct, total) of sampled inference over ``test_ids`` (this rank's share)."""
    model.eval()
    if test_ids.numel() == 0:
        return 0, 0
    loader = _loader(data, test_ids, args, shuffle=False, batch_size=max(args.batch_size, 1024))
    correct = total = 0
    rng = RngStream(_stream_seed(args.seed, rank, 2))
    with rng:
        batches = iter(loader)
    while True:
        with rng:
            batch = next(batches, None)
        if batch is None:
            break
        batch = batch.to(device)
        pred = model(batch.x, batch.edge_index)[: batch.batch_size].argmax(-1)
        correct += int((pred == batch.y[: batch.batch_size]).sum())
        total += batch.batch_size
    return correct, total


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    size = default_scale(args, torch.device(args.device))
    if os.environ.get("RANK", "0") == "0":  # the first line, before the slow imports and the process group
        graph = f"{args.dataset} ({size})" if args.dataset in _synthetic_names() else args.dataset
        print(f"pyg_ddp: {args.layer} on {args.device}, {graph}, {args.epochs} epoch(s), world size "
              f"{os.environ.get('WORLD_SIZE', '1')}; starting ...", flush=True)
    if import_pyg() is None:
        raise SystemExit("torch_geometric is not installed: pip install -e '.[pyg]'")
    import torch_geometric.typing as pyg_typing

    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        raise SystemExit("NeighborLoader needs pyg-lib or torch-sparse; neither imports here")

    rank, local_rank, world, device, backend = init_distributed(args)
    try:
        return _run(args, rank, local_rank, world, device, backend)
    finally:
        dist.destroy_process_group()


def _run(args, rank, local_rank, world, device, backend) -> int:
    import gnn_fastpath

    mode = enable_fastpath(args.fastpath, device, "pyg")
    data, train_idx, test_idx, num_classes, text = load_data(args)
    train_ids = shard(train_idx, rank, world, args.seed, equal=True)
    if train_ids.numel() == 0:
        raise SystemExit(f"{train_idx.numel()} training ids cannot be shared among {world} ranks")
    test_ids = test_idx
    if args.eval_nodes > 0:
        test_ids = test_idx[: args.eval_nodes]
    test_ids = shard(test_ids, rank, world, args.seed, equal=False) if args.eval_nodes >= 0 else test_idx[:0]
    if rank == 0:
        print(text)
        print(f"world size {world} ({backend}); rank 0 on {device}; {mode}")
        print(f"model: {len(args.fanouts)} x {args.layer}, fan-outs {args.fanouts}, batch size {args.batch_size} per "
              f"rank, {train_ids.numel():,} training ids per rank", flush=True)

    torch.manual_seed(args.seed)  # the same initial parameters everywhere (DDP also broadcasts rank 0's)
    model = Net(args.layer, data.x.size(1), args.hidden, args.heads, num_classes, len(args.fanouts),
                args.dropout, args.attn_dropout).to(device)
    torch.manual_seed(_stream_seed(args.seed, rank, 0))  # dropout: a stream per rank
    ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    run = train(ddp_model, data, train_ids, args, device, rank)
    if rank == 0 and not args.quiet and test_ids.numel():
        print(f"[rank 0] evaluating {test_ids.numel():,} test nodes per rank ...", flush=True)
    correct, total = evaluate(model, data, test_ids, args, device, rank)
    sha, psum = param_checksum(model)
    stats = gnn_fastpath.stats()
    fused, fallback = _counts(stats)
    mine = {
        "rank": rank, "local_rank": local_rank, "host": socket.gethostname(), "device": str(device),
        "device_name": device_name(device), "stats": stats, "fused_calls": fused, "fallback_calls": fallback,
        "steps": len(run["losses"]), "median_step_ms": _median_ms(run["step_s"]),
        "median_sample_ms": _median_ms(run["sample_s"]),
        "median_model_ms": _median_ms([a - b for a, b in zip(run["step_s"], run["sample_s"])]),
        "param_sha256": sha, "param_sum": psum,
        "test_correct": correct, "test_total": total, "test_acc": correct / total if total else float("nan"),
        "step_ms": [round(1e3 * t, 3) for t in run["step_s"]], "losses": run["losses"],
    }
    ranks: List[Dict] = [None] * world  # type: ignore[list-item]
    dist.all_gather_object(ranks, mine)
    if rank != 0:
        return 0

    all_correct = sum(r["test_correct"] for r in ranks)
    all_total = sum(r["test_total"] for r in ranks)
    accuracy = all_correct / all_total if all_total else float("nan")
    same = len({r["param_sha256"] for r in ranks}) == 1
    print(f"{'rank':>4}  {'host':<16} {'device':<28} {'steps':>5} {'step ms':>9} {'sample ms':>9} "
          f"{'model ms':>9} {'test acc':>8}  fused/fallback calls")
    for r in ranks:
        print(f"{r['rank']:>4}  {r['host'][:16]:<16} {r['device_name'][:28]:<28} {r['steps']:>5} "
              f"{r['median_step_ms']:>9.1f} {r['median_sample_ms']:>9.1f} "
              f"{r['median_model_ms']:>9.1f} {r['test_acc']:>8.4f}  "
              f"{r['fused_calls']}/{r['fallback_calls']}")
    print(f"test accuracy {accuracy:.4f} ({all_correct}/{all_total}); parameters identical on every rank: "
          f"{'yes' if same else 'NO'}")
    print(f"gnn_fastpath.stats() on rank 0: {ranks[0]['stats']}", flush=True)
    if args.json:
        steps = min(len(r["losses"]) for r in ranks)
        record = {
            "args": {k: v for k, v in vars(args).items()}, "world_size": world, "backend": backend,
            "fastpath": args.fastpath, "mode": mode, "data": text, "torch": torch.__version__,
            "gnn_fastpath": gnn_fastpath.__version__,
            "losses": [r["losses"] for r in ranks],
            "mean_losses": [sum(r["losses"][i] for r in ranks) / world for i in range(steps)],
            "test_acc": accuracy, "params_identical": same, "ranks": ranks,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # each line shows at once, also through a pipe
    sys.exit(main())
