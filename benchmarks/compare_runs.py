"""Side-by-side comparison of benchmark runs of two code versions (A/B), with their noise.

    python -m benchmarks.compare_runs DIR [--md OUT.md]

``DIR`` holds ``<kind>-<label>-<round>.json`` files: kind ``ops`` (``bench_ops``), ``layers``
(``bench_layers``), ``host`` (``bench_host``) or ``train`` (``bench_train_full``);
``benchmarks/ab_run.sh`` makes them, labels ``before`` and ``after``, rounds alternating. For
every row (graph, op or layer, shape, variant; for host and train also the mode, stock or
enabled: the stock rows show the machine's drift between rounds) and timing the table gives
each label's median over rounds, after/before, and the noise: the largest relative spread
between rounds of the same code. A change smaller than the noise is no change. Times are ms,
host times us.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
from collections import defaultdict
from typing import Dict, List, Tuple

_NAME = re.compile(r"(ops|layers|host|train)-(\w+)-(\d+)\.json$")
#: (kind, key fields, timing fields)
#: What a row without the key measured (runs from before the key existed: float32, no autocast).
_UNSET = {"dtype": "float32", "autocast": "off"}
_KINDS = {
    "ops": (("graph", "op", "shape", "dtype", "variant"), ("fwd_ms", "fwd_bwd_ms")),
    "layers": (("graph", "layer", "autocast"), ("fused_fwd_ms", "fused_fwd_bwd_ms")),
    "host": (("label", "pass", "graph", "mode"), ("host_us",)),
    "train": (("graph", "layer", "dtype", "mode"), ("step_ms",)),
}


def load(directory: str) -> Dict[Tuple, Dict[str, List[float]]]:
    """(kind, row key, timing) -> label -> [ms per round]."""
    table: Dict[Tuple, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        m = _NAME.search(os.path.basename(path))
        if not m:
            continue
        kind, label = m.group(1), m.group(2)
        keys, timings = _KINDS[kind]
        with open(path) as f:
            rows = json.load(f)["rows"]
        for row in rows:
            # the reference backend's rows (bench_ops times it too) are not the fused code's
            if row.get("status") != "ok" or row.get("backend") == "reference":
                continue
            for t in timings:
                if row.get(t) is not None:
                    key = tuple(str(row.get(k, _UNSET.get(k, ""))) for k in keys)
                    table[(kind, key, t)][label].append(float(row[t]))
    return table


def spread(values: List[float]) -> float:
    """(max - min) / median of one code version's rounds (0 for a single round)."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def compare(table, before: str = "before", after: str = "after") -> List[dict]:
    out = []
    for (kind, key, timing), runs in sorted(table.items()):
        if before not in runs or after not in runs:
            continue
        b, a = statistics.median(runs[before]), statistics.median(runs[after])
        out.append(dict(kind=kind, row=" / ".join(k for k in key if k), timing=timing, before=b, after=a,
                        ratio=a / b if b else float("nan"), noise=max(spread(runs[before]), spread(runs[after])),
                        rounds=min(len(runs[before]), len(runs[after]))))
    return out


def markdown(rows: List[dict]) -> str:
    lines = ["| kind | row | timing | before | after | after/before | noise (round spread) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        flag = " **slower**" if r["ratio"] - 1 > max(r["noise"], 0.05) else ""
        lines.append(f"| {r['kind']} | {r['row']} | {r['timing']} | {r['before']:.3f} | {r['after']:.3f} | "
                     f"{r['ratio']:.3f}{flag} | {100 * r['noise']:.1f}% |")
    if rows:
        ratios = [r["ratio"] for r in rows]
        noises = [r["noise"] for r in rows]
        lines.append("")
        lines.append(f"{len(rows)} timings; after/before median {statistics.median(ratios):.3f}, "
                     f"min {min(ratios):.3f}, max {max(ratios):.3f}; round spread median "
                     f"{100 * statistics.median(noises):.1f}%, max {100 * max(noises):.1f}%")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("directory")
    p.add_argument("--md", default=None, help="also write the table here")
    args = p.parse_args(argv)
    text = markdown(compare(load(args.directory)))
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
