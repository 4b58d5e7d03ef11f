#!/usr/bin/env bash
# One device call: install offline, GPU tests, memcheck, benchmarks, summary (printed last).
#
#   bash benchmarks/device_run.sh [quick|full]
#
# Run from the repository root on the device machine (its python3 has torch, CuPy, PyG;
# no package registry). Expects ./.data/tolokers.npz (carry .data) and optionally DGL
# wheels in ./.whl (carry .whl). Writes at most 8 files into $OUT (flat):
#   summary.md  pytest.log  sanitizer.log  bench.log
#   bench_ops.json  bench_layers.json  bench_train_full.json  bench_train_sampled.json
# (the markdown tables go into summary.md, not into files of their own: 8 is the limit).
# The optional stages (HOST_S, COMPILE_S, DDP_S; off by default) add bench_host.json,
# bench_compile.json, ddp.json: switch off a stage you do not need when you switch one on.
# Time budget for the whole script: quick 300 s, full 570 s (override BUDGET_S); each
# stage gets at most its own cap (override PYTEST_CUDA_S, PYTEST_REST_S, SANITIZER_S,
# OPS_S, LAYERS_S, TRAIN_S) and never more than what is left of the budget. Stages that run
# out of time are cut, and whatever they wrote so far is kept.
# Extra benchmark arguments: OPS_ARGS (default "--dtypes float32,bfloat16"), LAYERS_ARGS
# (default "--autocast off,bfloat16"), TRAIN_ARGS (default none: every graph, layer, fp32
# and bf16; given to both training tools, e.g. TRAIN_ARGS="--graphs pokec-like --dtypes
# float32,bfloat16,float16"), FULL_ARGS / SAMPLED_ARGS (one tool only), COMPILE_ARGS.
# TRAIN_MODES (default "full sampled") picks the training tools of the TRAIN_S stage.
# Set GNN_FASTPATH_COMMIT=<sha> in the command (the device copy has no .git).
set -u
MODE=${1:-quick}
OUT=${OUT:-/tmp/gnn_fastpath_out}
rm -rf /tmp/bench /tmp/pytest_cuda.log /tmp/pytest_rest.log  # nothing of an earlier call on this machine
mkdir -p "$OUT" /tmp/bench
export PYTHONUNBUFFERED=1
START=$SECONDS
case "$MODE" in
  quick)
    BUDGET=${BUDGET_S:-300}
    CAP_PYTEST_CUDA=${PYTEST_CUDA_S:-60}; CAP_PYTEST_REST=${PYTEST_REST_S:-30}; CAP_SAN=${SANITIZER_S:-45}
    CAP_OPS=${OPS_S:-60}; CAP_LAYERS=${LAYERS_S:-40}; CAP_TRAIN=${TRAIN_S:-60}
    BENCH_FLAGS="--quick" ;;
  full)
    BUDGET=${BUDGET_S:-570}
    CAP_PYTEST_CUDA=${PYTEST_CUDA_S:-120}; CAP_PYTEST_REST=${PYTEST_REST_S:-60}; CAP_SAN=${SANITIZER_S:-90}
    CAP_OPS=${OPS_S:-150}; CAP_LAYERS=${LAYERS_S:-110}; CAP_TRAIN=${TRAIN_S:-150}
    BENCH_FLAGS="" ;;
  *) echo "usage: bash benchmarks/device_run.sh [quick|full]"; exit 2 ;;
esac
OPS_ARGS=${OPS_ARGS---dtypes float32,bfloat16}
LAYERS_ARGS=${LAYERS_ARGS---autocast off,bfloat16}
TRAIN_ARGS=${TRAIN_ARGS-}
TRAIN_MODES=${TRAIN_MODES-full sampled}
SUMMARY=$OUT/summary.md
STAGES=""

# seconds a stage may take: its cap, cut to what is left of the budget (15 s kept for the summary)
stage_time() {
  local want=$1 left=$(( BUDGET - (SECONDS - START) - 15 ))
  (( left < want )) && want=$left
  echo "$want"
}
note_stage() { STAGES="$STAGES| $1 | $2 | $3 s |"$'\n'; }

# ---------------------------------------------------------------- install (offline)
mkdir -p /tmp/site
WHEELS="none"
if ls .whl/*.whl >/dev/null 2>&1; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      >/tmp/pip_whl.log 2>&1; then WHEELS="$(cd .whl && ls *.whl | tr '\n' ' ')"; else WHEELS="FAILED: $(tail -3 /tmp/pip_whl.log)"; fi
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
# PyG's NeighborLoader needs torch_sparse (or pyg-lib), which has no wheel for the device's
# torch: carry its source distributions (and torch_scatter's) in .whl/sdist/ and they are
# built here, CPU-only (sampling runs on the CPU), once per machine; the built wheels are
# copied to $OUT so that later calls can carry them in .whl/ instead.
# torch_sparse is a dozen small extensions that setuptools builds one after another: the
# unpacked sources get `[build_ext] parallel` so they compile side by side (minutes, not 20).
# Not with ninja: torch's BuildExtension writes one build.ninja per build directory, which
# extensions built in parallel would overwrite: a failing `ninja` first on PATH turns it off.
if ls .whl/sdist/*.tar.gz >/dev/null 2>&1 && ! python3 -c "import torch_sparse" >/dev/null 2>&1; then
  s0=$SECONDS
  rm -rf /tmp/sdist_src && mkdir -p /tmp/sdist_src
  for t in .whl/sdist/*.tar.gz; do tar xzf "$t" -C /tmp/sdist_src; done
  for d in /tmp/sdist_src/*/; do printf '\n[build_ext]\nparallel = %s\n' "$(nproc)" >> "$d/setup.cfg"; done
  mkdir -p /tmp/no_ninja && printf '#!/bin/sh\nexit 1\n' > /tmp/no_ninja/ninja && chmod +x /tmp/no_ninja/ninja
  if PATH=/tmp/no_ninja:$PATH FORCE_ONLY_CPU=1 python3 -m pip wheel -q --no-deps --no-build-isolation --no-index \
      -w /tmp/sdist_wheels /tmp/sdist_src/*/ >/tmp/pip_sdist.log 2>&1 \
      && python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/sdist_wheels/*.whl >>/tmp/pip_sdist.log 2>&1; then
    cp /tmp/sdist_wheels/*.whl "$OUT/" 2>/dev/null
    WHEELS="$WHEELS; built from sdist in $(( SECONDS - s0 )) s: $(cd /tmp/sdist_wheels && ls *.whl | tr '\n' ' ')"
  else WHEELS="$WHEELS; sdist build FAILED (log in \$OUT/pip_sdist.log): $(grep -m3 -iE "error" /tmp/pip_sdist.log | tr '\n' ' ' | cut -c1-400)"
    cp /tmp/pip_sdist.log "$OUT/"; fi
fi
# Real graphs for the tests (../shared does not travel): carry .data with heterophilous/ and planetoid/.
[ -d .data/planetoid ] && export GNN_FASTPATH_DATA=${GNN_FASTPATH_DATA:-$PWD/.data}
# The package maps ./integrations to gnn_fastpath.integrations (pyproject package-dir), so a
# plain PYTHONPATH=$PWD cannot import gnn_fastpath.integrations. An editable install puts a
# finder for that mapping into the system site-packages (offline: setuptools and wheel are
# on the machine; --no-build-isolation keeps pip from fetching them). If that fails, install
# a regular copy into /tmp/gfp and run python with -P, so that the cwd's gnn_fastpath
# (without the mapping) does not shadow the copy.
PY="python3"
if python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/pip_e.log 2>&1 \
    && (cd / && python3 -c "import gnn_fastpath.integrations") >/dev/null 2>&1; then
  INSTALL="editable (pip install -e . into the system site-packages)"
else
  rm -rf /tmp/gfp
  if python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/gfp . >/tmp/pip_t.log 2>&1; then
    export PYTHONPATH=/tmp/gfp:$PYTHONPATH
    PY="python3 -P"
    INSTALL="copy in /tmp/gfp, python3 -P (editable failed: $(tail -1 /tmp/pip_e.log))"
  else
    INSTALL="FAILED (editable: $(tail -1 /tmp/pip_e.log); copy: $(tail -1 /tmp/pip_t.log)); PYTHONPATH=\$PWD only"
  fi
fi
IMPORT_CHECK=$($PY -c "import gnn_fastpath, gnn_fastpath.integrations as i; print(gnn_fastpath.__file__, i.__file__, 'cuda:', gnn_fastpath.cuda.unavailable_reason() or 'available')" 2>&1 | tail -1)
GPU=$(nvidia-smi -L 2>&1 | head -4)
echo "== GPU: $GPU"
echo "== install: $INSTALL"
echo "== import: $IMPORT_CHECK"
echo "== wheels: $WHEELS"
if [ ! -f .data/tolokers.npz ]; then echo "== WARNING: .data/tolokers.npz missing (carry .data): tolokers rows will say 'missing data'"; fi
note_stage install "done" $(( SECONDS - START ))

# ---------------------------------------------------------------- tests
# pytest-xdist (on the device image) spreads tests over workers: PYTEST_WORKERS_CUDA
# (default 4) for the GPU tests, PYTEST_WORKERS_REST (default 8) for the rest; 0 = serial.
XD_CUDA=""; XD_REST=""
if $PY -c "import xdist" >/dev/null 2>&1; then
  (( ${PYTEST_WORKERS_CUDA:-4} > 0 )) && XD_CUDA="-n ${PYTEST_WORKERS_CUDA:-4}"
  (( ${PYTEST_WORKERS_REST:-8} > 0 )) && XD_REST="-n ${PYTEST_WORKERS_REST:-8}"
fi
# Both pytest stages write into $OUT/pytest.log (a header line each); their count lines are
# taken from their own copies in /tmp.
t=$(stage_time "$CAP_PYTEST_CUDA"); s0=$SECONDS
if (( t > 5 )); then
  echo "== pytest -m cuda $XD_CUDA (limit ${t} s)"
  echo "== pytest tests -m cuda $XD_CUDA" >>"$OUT/pytest.log"
  timeout -k 5 "$t" $PY -m pytest tests -m cuda -q ${PYTEST_CUDA_FLAGS--x} -p no:cacheprovider $XD_CUDA 2>&1 \
    | tee /tmp/pytest_cuda.log >>"$OUT/pytest.log"
  rc=${PIPESTATUS[0]}; tail -5 /tmp/pytest_cuda.log
  note_stage "pytest -m cuda" "exit $rc$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s0 ))
else note_stage "pytest -m cuda" "skipped: budget" 0; fi

t=$(stage_time "$CAP_PYTEST_REST"); s0=$SECONDS
if (( t > 5 )); then
  echo "== pytest -m 'not cuda' $XD_REST (limit ${t} s)"
  echo "== pytest tests -m 'not cuda' $XD_REST" >>"$OUT/pytest.log"
  timeout -k 5 "$t" $PY -m pytest tests -m "not cuda" -q -p no:cacheprovider $XD_REST 2>&1 \
    | tee /tmp/pytest_rest.log >>"$OUT/pytest.log"
  rc=${PIPESTATUS[0]}; tail -3 /tmp/pytest_rest.log
  note_stage "pytest -m 'not cuda'" "exit $rc$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s0 ))
else note_stage "pytest -m 'not cuda'" "skipped: budget" 0; fi

# ---------------------------------------------------------------- memcheck
t=$(stage_time "$CAP_SAN"); s0=$SECONDS
if (( t > 5 )) && command -v compute-sanitizer >/dev/null 2>&1; then
  echo "== compute-sanitizer memcheck (limit ${t} s)"
  SANITIZE_COMPARE=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 5 "$t" compute-sanitizer --tool memcheck --error-exitcode 86 \
    --print-limit 30 --target-processes all $PY benchmarks/sanitize_small.py >"$OUT/sanitizer.log" 2>&1
  rc=$?; grep -E "ERROR SUMMARY|SANITIZE_SMALL|FAIL " "$OUT/sanitizer.log" | tail -5
  note_stage "memcheck sanitize_small.py" "exit $rc$( ((rc==86)) && echo ' (memcheck errors)')$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s0 ))
else
  note_stage "memcheck sanitize_small.py" "skipped: $(command -v compute-sanitizer >/dev/null || echo 'no compute-sanitizer; ')budget ${t} s" 0
fi

# ---------------------------------------------------------------- benchmarks
t=$(stage_time "$CAP_OPS"); s0=$SECONDS
if (( t > 10 )); then
  echo "== bench_ops $BENCH_FLAGS $OPS_ARGS (limit ${t} s)"
  timeout -k 10 "$t" $PY -m benchmarks.bench_ops $BENCH_FLAGS $OPS_ARGS --out /tmp/bench --json-out "$OUT/bench_ops.json" \
    --md /tmp/bench/bench_ops.md --budget-s $(( t * 85 / 100 )) \
    --variant "GNN_FASTPATH_GATV2_BWD=atomic GNN_FASTPATH_DOT_BWD=atomic" \
    --variant "GNN_FASTPATH_GATV2_BWD=transposed GNN_FASTPATH_DOT_BWD=transposed" >>"$OUT/bench.log" 2>&1
  rc=$?; note_stage bench_ops "exit $rc$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s0 ))
else note_stage bench_ops "skipped: budget" 0; fi

t=$(stage_time "$CAP_LAYERS"); s0=$SECONDS
if (( t > 10 )); then
  echo "== bench_layers $BENCH_FLAGS $LAYERS_ARGS (limit ${t} s)"
  timeout -k 10 "$t" $PY -m benchmarks.bench_layers $BENCH_FLAGS $LAYERS_ARGS --out /tmp/bench \
    --json-out "$OUT/bench_layers.json" --md /tmp/bench/bench_layers.md --budget-s $(( t * 80 / 100 )) >>"$OUT/bench.log" 2>&1
  rc=$?; note_stage bench_layers "exit $rc$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s0 ))
else note_stage bench_layers "skipped: budget" 0; fi

# training steps (TRAIN_S for both tools): full batch (the issue-10 targets first) gets up to half
# of the stage, sampled mini-batches (the sampled targets first) the rest; --time-budget starts
# no config after 80% of a tool's share
t=$(stage_time "$CAP_TRAIN"); s0=$SECONDS
if (( t > 10 )); then
  for what in $TRAIN_MODES; do
    left=$(( t - (SECONDS - s0) ))
    share=$left; [ "$what" = full ] && [[ "$TRAIN_MODES" == *sampled* ]] && share=$(( t / 2 ))
    (( share > left )) && share=$left
    if (( share <= 10 )); then note_stage "bench_train_$what" "skipped: budget" 0; continue; fi
    case "$what" in full) extra=${FULL_ARGS-} ;; sampled) extra=${SAMPLED_ARGS-} ;;
      *) note_stage "bench_train_$what" "unknown TRAIN_MODES entry" 0; continue ;; esac
    s1=$SECONDS
    echo "== bench_train_$what $BENCH_FLAGS $TRAIN_ARGS $extra (limit ${share} s)"
    timeout -k 10 "$share" $PY -m "benchmarks.bench_train_$what" $BENCH_FLAGS $TRAIN_ARGS $extra \
      --json "$OUT/bench_train_$what.json" --markdown "/tmp/bench/bench_train_$what.md" \
      --time-budget $(( share * 80 / 100 )) >>"$OUT/bench.log" 2>&1
    rc=$?; note_stage "bench_train_$what" "exit $rc$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s1 ))
  done
else note_stage "bench_train" "skipped: budget" 0; fi

# torch.compile'd training steps (off unless COMPILE_S is set)
CAP_COMPILE=${COMPILE_S:-0}
t=$(stage_time "$CAP_COMPILE"); s0=$SECONDS
if (( t > 10 )); then
  echo "== bench_compile $BENCH_FLAGS ${COMPILE_ARGS-} (limit ${t} s)"
  timeout -k 10 "$t" $PY -m benchmarks.bench_compile $BENCH_FLAGS ${COMPILE_ARGS-} --json "$OUT/bench_compile.json" \
    --markdown /tmp/bench/bench_compile.md --time-budget $(( t * 80 / 100 )) >>"$OUT/bench.log" 2>&1
  rc=$?; note_stage bench_compile "exit $rc$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s0 ))
else note_stage bench_compile "skipped: budget" 0; fi

# host time per layer call (GPU time excluded)
CAP_HOST=${HOST_S:-0}
t=$(stage_time "$CAP_HOST"); s0=$SECONDS
if (( t > 10 )); then
  echo "== bench_host (limit ${t} s)"
  timeout -k 10 "$t" $PY -m benchmarks.bench_host --time-budget $(( t * 75 / 100 )) --json "$OUT/bench_host.json" \
    --markdown /tmp/bench/bench_host.md >>"$OUT/bench.log" 2>&1
  rc=$?; note_stage bench_host "exit $rc$( ((rc==124)) && echo ' (time limit)')" $(( SECONDS - s0 ))
else note_stage bench_host "skipped: budget" 0; fi

# DDP: examples/pyg_ddp.py under torchrun on 1 and 2 GPUs, stock and enabled (DDP_S cap,
# DDP_LAYERS, DDP_STEPS); every run's record merged into $OUT/ddp.json
CAP_DDP=${DDP_S:-0}
t=$(stage_time "$CAP_DDP"); s0=$SECONDS
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
if (( t > 20 && NGPU >= 2 )); then
  echo "== DDP runs (limit ${t} s)"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  mkdir -p /tmp/ddp
  for layer in ${DDP_LAYERS:-gatv2 sage_max transformer}; do
    for n in 1 2; do
      for fp in --no-fastpath --fastpath; do
        left=$(( t - (SECONDS - s0) ))
        (( left < 15 )) && break 3
        timeout -k 5 "$left" $PY -m torch.distributed.run --standalone --nproc-per-node "$n" examples/pyg_ddp.py \
          --layer "$layer" --steps "${DDP_STEPS:-25}" --dropout 0 --quiet $fp \
          --json "/tmp/ddp/${layer}_${n}gpu_${fp#--}.json" >>"$OUT/bench.log" 2>&1
      done
    done
  done
  $PY -c "
import glob, json, os
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob('/tmp/ddp/*.json'))}
json.dump(runs, open('$OUT/ddp.json', 'w'), indent=1)
print('| run | per-rank step ms (median, incl. sampling) | sampling ms | model step ms |')
print('| --- | --- | --- | --- |')
for k, r in runs.items():
    for rank in r.get('ranks', []):
        print(f'| {k} rank {rank.get(\"rank\")} | {rank.get(\"median_step_ms\")} | {rank.get(\"median_sample_ms\")} | {rank.get(\"median_model_ms\")} |')
" >/tmp/bench/ddp.md 2>&1
  note_stage ddp "$(ls /tmp/ddp/*.json 2>/dev/null | wc -l) runs" $(( SECONDS - s0 ))
else note_stage ddp "skipped: $NGPU GPUs, budget ${t} s" 0; fi

# ---------------------------------------------------------------- summary (printed last)
last_line() {  # pytest's final count line, or why there is none
  [ -f "$1" ] || { echo "(not run)"; return; }
  local l; l=$(grep -E "(passed|failed|skipped|deselected|errors?|no tests ran).* in [0-9.]+s" "$1" | tail -1)
  echo "${l:-no summary line (cut by the time limit?): $(tail -1 "$1" | cut -c1-150)}"
}
{
  echo "# gnn_fastpath device run ($MODE) $(date -u +%FT%TZ)"
  echo
  echo "- GPU: $(echo "$GPU" | head -1)"
  echo "- commit: ${GNN_FASTPATH_COMMIT:-unknown (set GNN_FASTPATH_COMMIT)}"
  echo "- install: $INSTALL; import: $IMPORT_CHECK"
  echo "- wheels: $WHEELS"
  echo "- pytest -m cuda: $(last_line /tmp/pytest_cuda.log)"
  echo "- pytest -m 'not cuda': $(last_line /tmp/pytest_rest.log)"
  echo "- memcheck: $([ -f "$OUT/sanitizer.log" ] && grep -E "ERROR SUMMARY|SANITIZE_SMALL" "$OUT/sanitizer.log" | tr '\n' ' ' || echo '(not run)')"
  echo
  echo "| stage | result | seconds |"
  echo "| --- | --- | --- |"
  printf "%s" "$STAGES"
  echo
  $PY -m benchmarks.report summary "$OUT/bench_ops.json" "$OUT/bench_layers.json" 2>&1
  echo
  for f in /tmp/bench/bench_train_full.md /tmp/bench/bench_train_sampled.md /tmp/bench/bench_compile.md; do
    [ -f "$f" ] && cat "$f" && echo; done
  echo "## full tables"
  for f in /tmp/bench/bench_ops.md /tmp/bench/bench_layers.md /tmp/bench/bench_host.md /tmp/bench/ddp.md; do [ -f "$f" ] && cat "$f" && echo; done
} >"$SUMMARY" 2>&1
echo
echo "================ SUMMARY (full tables in summary.md) ================"
sed '/^## full tables/,$d' "$SUMMARY"
echo "total ${SECONDS}s (budget ${BUDGET}s)"
