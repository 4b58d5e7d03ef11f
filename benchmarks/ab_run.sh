#!/usr/bin/env bash
# A/B benchmark of two checkouts in one device call: bench_ops and bench_layers (quick), then
# host time per layer call (bench_host) and full-batch training steps (bench_train_full),
# alternating before, after, before, after, ... so drift hits both; then the comparison
# table (benchmarks/compare_runs.py) with each version's round-to-round spread as the noise.
# bench_ops and bench_layers run each checkout's own script; bench_host and bench_train_full
# run this checkout's script over each checkout's package (an older checkout may not have them),
# so their stock rows (the same code in both) show the machine's drift.
#
#   bash benchmarks/ab_run.sh BEFORE_DIR [ROUNDS]      (from the repository root = "after")
#
# BEFORE_DIR is a checkout of the older commit inside the repository (carry it). Writes
# $OUT/ab_compare.md and $OUT/ab_runs.tar.gz (every JSON), refreshed after every round. ROUNDS
# defaults to 2.
# AB_OPS_ARGS / AB_LAYERS_ARGS / AB_HOST_ARGS / AB_TRAIN_ARGS replace the benchmarks' arguments
# (defaults: "--quick"; host "--calls 500 --time-budget 30"; train "--quick --graphs tolokers
# --layers gatv2,transformer,gcn,sage_max --dtypes float32,bfloat16 --time-budget 90"); "skip"
# leaves that benchmark out. Each run has AB_TIMEOUT seconds (default 300).
set -u
BEFORE=$(cd "$1" && pwd); AFTER=$PWD; ROUNDS=${2:-2}
OUT=${OUT:-/tmp/ab_out}; WORK=/tmp/ab; T=${AB_TIMEOUT:-300}
mkdir -p "$OUT" "$WORK"
rm -f "$WORK"/*.json "$WORK/bench.log"  # a warm machine keeps /tmp: no runs of an earlier call
export PYTHONUNBUFFERED=1
DATA="--data-dir $AFTER/.data"
for tree in before after; do
  dir=$BEFORE; [ "$tree" = after ] && dir=$AFTER
  rm -rf "$WORK/pkg-$tree"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$WORK/pkg-$tree" "$dir" \
    >"$WORK/pip-$tree.log" 2>&1 || { echo "install of $tree failed"; tail -3 "$WORK/pip-$tree.log"; exit 1; }
done
for r in $(seq 1 "$ROUNDS"); do
  for tree in before after; do
    dir=$BEFORE; [ "$tree" = after ] && dir=$AFTER
    echo "== round $r: $tree"
    (cd "$dir" && PYTHONPATH="$WORK/pkg-$tree:$dir${PYTHONPATH:+:$PYTHONPATH}" timeout "$T" python3 -P -m benchmarks.bench_ops ${AB_OPS_ARGS:---quick} --no-reference $DATA \
       --out "$WORK/o" --json-out "$WORK/ops-$tree-$r.json" --md "" >>"$WORK/bench.log" 2>&1) || echo "bench_ops $tree failed"
    [ "${AB_LAYERS_ARGS:-}" != skip ] && { (cd "$dir" && PYTHONPATH="$WORK/pkg-$tree:$dir${PYTHONPATH:+:$PYTHONPATH}" timeout "$T" python3 -P -m benchmarks.bench_layers \
       ${AB_LAYERS_ARGS:---quick} $DATA --out "$WORK/o" --json-out "$WORK/layers-$tree-$r.json" --md "" >>"$WORK/bench.log" 2>&1) \
       || echo "bench_layers $tree failed"; }
    [ "${AB_HOST_ARGS:-}" != skip ] && { PYTHONPATH="$WORK/pkg-$tree:$AFTER${PYTHONPATH:+:$PYTHONPATH}" timeout "$T" python3 -P -m benchmarks.bench_host \
       ${AB_HOST_ARGS:---calls 500 --time-budget 30} --out "$WORK/o" --json "$WORK/host-$tree-$r.json" --markdown "" \
       >>"$WORK/bench.log" 2>&1 || echo "bench_host $tree failed"; }
    [ "${AB_TRAIN_ARGS:-}" != skip ] && { PYTHONPATH="$WORK/pkg-$tree:$AFTER${PYTHONPATH:+:$PYTHONPATH}" timeout "$T" python3 -P -m benchmarks.bench_train_full \
       ${AB_TRAIN_ARGS:---quick --graphs tolokers --layers gatv2,transformer,gcn,sage_max --dtypes float32,bfloat16 --time-budget 90} \
       $DATA --out "$WORK/o" --json "$WORK/train-$tree-$r.json" --markdown "" >>"$WORK/bench.log" 2>&1 || echo "bench_train_full $tree failed"; }
  done
  # after every round: a run cut by its caller's time limit still leaves its comparison and JSON
  tar czf "$OUT/ab_runs.tar.gz" -C "$WORK" $(cd "$WORK" && ls *.json bench.log 2>/dev/null)
  python3 -m benchmarks.compare_runs "$WORK" --md "$OUT/ab_compare.md" >/dev/null 2>&1 || echo "compare after round $r failed"
done
python3 -m benchmarks.compare_runs "$WORK" --md "$OUT/ab_compare.md"
