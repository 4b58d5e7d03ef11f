#!/usr/bin/env bash
# A/B benchmark of two checkouts in one device call: bench_ops and bench_layers (quick),
# alternating before, after, before, after, ... so drift hits both; then the comparison
# table (benchmarks/compare_runs.py) with each version's round-to-round spread as the noise.
#
#   bash benchmarks/ab_run.sh BEFORE_DIR [ROUNDS]      (from the repository root = "after")
#
# BEFORE_DIR is a checkout of the older commit inside the repository (carry it). Writes
# $OUT/ab_compare.md and $OUT/ab_runs.tar.gz (every JSON). ROUNDS defaults to 2.
# AB_OPS_ARGS / AB_LAYERS_ARGS replace the benchmarks' arguments (default "--quick";
# AB_LAYERS_ARGS=skip leaves bench_layers out).
set -u
BEFORE=$(cd "$1" && pwd); AFTER=$PWD; ROUNDS=${2:-2}
OUT=${OUT:-/tmp/ab_out}; WORK=/tmp/ab
mkdir -p "$OUT" "$WORK"
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
    (cd "$dir" && PYTHONPATH="$WORK/pkg-$tree:$dir" python3 -P -m benchmarks.bench_ops ${AB_OPS_ARGS:---quick} --no-reference $DATA \
       --out "$WORK/o" --json-out "$WORK/ops-$tree-$r.json" --md "" >>"$WORK/bench.log" 2>&1) || echo "bench_ops $tree failed"
    [ "${AB_LAYERS_ARGS:-}" = skip ] && continue
    (cd "$dir" && PYTHONPATH="$WORK/pkg-$tree:$dir" python3 -P -m benchmarks.bench_layers ${AB_LAYERS_ARGS:---quick} $DATA \
       --out "$WORK/o" --json-out "$WORK/layers-$tree-$r.json" --md "" >>"$WORK/bench.log" 2>&1) || echo "bench_layers $tree failed"
  done
done
tar czf "$OUT/ab_runs.tar.gz" -C "$WORK" $(cd "$WORK" && ls *.json bench.log 2>/dev/null)
python3 -m benchmarks.compare_runs "$WORK" --md "$OUT/ab_compare.md"
