"""PyG's own example scripts, unchanged: per-epoch time stock against ``gnn_fastpath.enable()``.

What a new user tries first: a script from PyG's ``examples/`` folder with the one line added.
Each case (a script and its arguments) runs in its own process (:mod:`benchmarks.pyg_example_run`),
stock and enabled, ``--rounds`` times, which mode goes first flipping every round. The time is
the script's own "Median time per epoch" line (scripts that print none get accuracy only); the
accuracy is the last "Test: <acc>" the script logs. A case's verdict compares the medians over
the rounds: ``no slower`` when enabled <= stock.

The scripts are read from a PyG checkout (``--examples-dir``; never copied into this
repository); the Planetoid raw files (``ind.cora.*``, ``ind.citeseer.*``, ``ind.pubmed.*``),
looked up as :mod:`benchmarks.bench_examples` does, are laid out where the scripts look for
them (``../data/Planetoid/<Name>/raw`` and ``../data/<Name>/<Name>/raw`` beside a temporary
copy of the scripts), so nothing is downloaded.

    python -m benchmarks.bench_pyg_examples --examples-dir ../pytorch_geometric/examples --rounds 3
    python -m benchmarks.bench_pyg_examples --examples-dir DIR --cases "gcn.py --dataset Cora;gat.py"
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from . import harness as H
from .bench_examples import planetoid_raw
from .pyg_example_run import STATS_TAG

REPO_ROOT = Path(__file__).resolve().parents[1]

#: The scripts of PyG's examples/ that run offline on the Planetoid graphs with a patched layer.
DEFAULT_CASES = ("gcn.py --dataset Cora", "gcn.py --dataset CiteSeer", "gat.py --dataset Cora",
                 "gat.py --dataset CiteSeer", "agnn.py")
#: Planetoid names as PyG spells them -> the raw files' prefix.
PLANETOID = {"Cora": "cora", "CiteSeer": "citeseer", "PubMed": "pubmed"}

_EPOCH = re.compile(r"Median time per epoch: ([0-9.eE+-]+)s")
_TEST = re.compile(r"Test: ([0-9.]+)")


def lay_out(examples_dir: Path, scripts: List[str], data_dir, root: Path) -> Dict[str, str]:
    """Copy ``scripts`` into ``root/examples`` and the Planetoid raw files found into the two
    layouts the scripts use; returns {name: "found" / "missing"} per Planetoid graph."""
    (root / "examples").mkdir(parents=True)
    for script in scripts:
        src = examples_dir / script
        if not src.is_file():
            raise SystemExit(f"--examples-dir: {src} does not exist")
        shutil.copy(src, root / "examples" / script)
    found = {}
    for name, prefix in PLANETOID.items():
        raw = planetoid_raw(prefix, data_dir)
        found[name] = "found" if raw is not None else "missing"
        if raw is None:
            continue
        for dest in (root / "data" / "Planetoid" / name / "raw", root / "data" / name / name / "raw"):
            dest.mkdir(parents=True, exist_ok=True)
            for f in raw.glob(f"ind.{prefix}.*"):
                shutil.copy(f, dest / f.name)
    return found


def parse_output(text: str) -> dict:
    """The script's median epoch time (ms), last logged test accuracy and, enabled, what ran."""
    out: Dict[str, object] = {"epoch_ms": None, "test_acc": None}
    times = _EPOCH.findall(text)
    if times:
        out["epoch_ms"] = float(times[-1]) * 1e3
    accs = _TEST.findall(text)
    if accs:
        out["test_acc"] = float(accs[-1])
    for line in text.splitlines():
        if line.startswith(STATS_TAG + " "):
            stats = json.loads(line[len(STATS_TAG) + 1:])
            out["fused"] = {k: sum(v.get("fused", {}).values()) for k, v in stats.items()
                            if isinstance(v, dict) and sum(v.get("fused", {}).values())}
            out["fallback"] = {k: v["fallback"] for k, v in stats.items() if isinstance(v, dict) and v.get("fallback")}
    return out


def run_case(root: Path, case: str, mode: str, timeout: float) -> dict:
    """One run of ``case`` (script and arguments) in ``mode``, in its own process."""
    script, *args = shlex.split(case)
    cmd = [sys.executable, "-m", "benchmarks.pyg_example_run", mode, str(root / "examples" / script), *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root / "examples", env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout:g} s", "wall_s": round(time.perf_counter() - t0, 2)}
    row = parse_output(proc.stdout)
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    row["status"] = "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    return row


def summarise(rows: List[dict], cases: List[str]) -> List[dict]:
    """Per case: the median epoch time of each mode over its rounds, stock / enabled, verdict."""
    out = []
    for case in cases:
        mine = {m: [r for r in rows if r["case"] == case and r["mode"] == m and r["status"] == "ok"]
                for m in ("stock", "enabled")}
        times = {m: [r["epoch_ms"] for r in mine[m] if isinstance(r.get("epoch_ms"), float)] for m in mine}
        s = {"case": case, "rounds": max(len(mine["stock"]), len(mine["enabled"]))}
        for m in ("stock", "enabled"):
            s[f"{m}_ms"] = statistics.median(times[m]) if times[m] else None
            s[f"{m}_ms_rounds"] = times[m]
            s[f"{m}_acc"] = [r.get("test_acc") for r in mine[m]]
        if s["stock_ms"] and s["enabled_ms"]:
            s["speedup"] = s["stock_ms"] / s["enabled_ms"]
            s["verdict"] = "no slower" if s["enabled_ms"] <= s["stock_ms"] else "slower"
        else:
            s["speedup"] = None
            s["verdict"] = "no time printed" if mine["stock"] and mine["enabled"] else "not run"
        paths = [r for r in mine["enabled"] if r.get("fused") is not None]
        if paths:
            last = paths[-1]
            s["path"] = "; ".join([f"{k} fused {v}" for k, v in last["fused"].items()]
                                  + [f"{k} {v}" for k, v in last.get("fallback", {}).items()])
        out.append(s)
    return out


def markdown(payload: dict) -> str:
    fmt = H.fmt
    cases = [dict(c) for c in payload["cases"]]  # display columns added to copies, not to the JSON
    for c in cases:
        c["stock_rounds"] = " / ".join(fmt(v) for v in c["stock_ms_rounds"])
        c["enabled_rounds"] = " / ".join(fmt(v) for v in c["enabled_ms_rounds"])
        c["accs"] = " / ".join(", ".join(fmt(a, 3) for a in c[f"{m}_acc"] if a is not None) or "-"
                               for m in ("stock", "enabled"))
    table = H.markdown_table(
        cases, ["case", "stock_ms", "enabled_ms", "speedup", "verdict", "stock_rounds", "enabled_rounds", "accs", "path"],
        ["script", "stock ms/epoch (median)", "enabled ms/epoch", "x", "enabled", "stock per round",
         "enabled per round", "test acc stock / enabled", "what ran (enabled, last round)"],
        {k: fmt for k in ("stock_ms", "enabled_ms", "speedup")})
    return "\n".join(["### PyG's example scripts, unchanged: stock vs enabled", "",
                      H.env_header(payload["environment"]), "", table, ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples-dir", required=True, help="PyG's examples/ folder (a checkout of pytorch_geometric)")
    p.add_argument("--cases", default=";".join(DEFAULT_CASES),
                   help="';'-separated cases, each a script of --examples-dir and its arguments "
                        f"(default: {'; '.join(DEFAULT_CASES)})")
    p.add_argument("--rounds", type=int, default=3, help="runs per case and mode, the first mode flipping (default 3)")
    p.add_argument("--timeout", type=float, default=180, help="seconds per run (default 180)")
    p.add_argument("--data-dir", default=None, help="where the Planetoid raw files are (default: the benchmarks' data dirs)")
    p.add_argument("--time-budget", type=float, default=None, help="seconds: start no new run after this")
    p.add_argument("--json", default=None, help="JSON path (default <out>/bench_pyg_examples.json)")
    p.add_argument("--markdown", default=None, help="markdown path (default <out>/bench_pyg_examples.md; '' for none)")
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results/)")
    a = p.parse_args(argv)
    if a.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    cases = [c.strip() for c in a.cases.split(";") if c.strip()]
    if not cases:
        raise SystemExit("--cases: no case given")
    examples_dir = Path(a.examples_dir)
    if not examples_dir.is_dir():
        raise SystemExit(f"--examples-dir: {examples_dir} is not a folder")
    start = time.perf_counter()
    rows: List[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        planetoid = lay_out(examples_dir, sorted({shlex.split(c)[0] for c in cases}), a.data_dir, root)
        for r in range(1, a.rounds + 1):
            for case in cases:
                for mode in ("stock", "enabled") if r % 2 else ("enabled", "stock"):
                    row = {"case": case, "mode": mode, "round": r}
                    if a.time_budget is not None and time.perf_counter() - start > a.time_budget:
                        row["status"] = "skipped: time budget"
                    else:
                        row.update(run_case(root, case, mode, a.timeout))
                    rows.append(row)
                    print(f"round {r} {case} {mode}: {row.get('status')} epoch_ms={row.get('epoch_ms')} "
                          f"test={row.get('test_acc')}", flush=True)
    payload = {"benchmark": "pyg_examples", "environment": H.environment(),
               "settings": {"examples_dir": str(examples_dir.resolve()), "cases": cases, "rounds": a.rounds,
                            "timeout": a.timeout, "planetoid": planetoid,
                            "elapsed_s": round(time.perf_counter() - start, 1)},
               "rows": rows, "cases": summarise(rows, cases)}
    text = markdown(payload)
    out = H.out_dir(a.out)
    H.publish(payload, text, a.json if a.json is not None else out / "bench_pyg_examples.json",
              a.markdown if a.markdown is not None else out / "bench_pyg_examples.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
