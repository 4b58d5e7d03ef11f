set -u
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /tmp/install.txt 2>&1 || { echo install failed; tail -20 /tmp/install.txt; }
export GNN_FASTPATH_DATA=$PWD/.data GNN_FASTPATH_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
T0=$SECONDS
SANITIZE_OPS=gatv2_attention SANITIZE_DTYPES=float32,bfloat16 SANITIZE_STATIC=0 SANITIZE_COMPARE=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
  timeout 170 compute-sanitizer --tool memcheck --error-exitcode 86 --target-processes all python3 benchmarks/sanitize_small.py > $OUT/memcheck_gatv2.txt 2>&1
echo "memcheck rc=$? $((SECONDS-T0)) s"; grep -c "^OK" $OUT/memcheck_gatv2.txt; grep -c "bwd=fused" $OUT/memcheck_gatv2.txt; tail -3 $OUT/memcheck_gatv2.txt
T0=$SECONDS
timeout 200 python3 -m benchmarks.bench_ops --quick --graphs twitch-like --ops gatv2_attention --dtypes float32,bfloat16 --no-reference \
  --variant GNN_FASTPATH_GATV2_BWD=atomic --variant GNN_FASTPATH_GATV2_BWD=transposed --variant GNN_FASTPATH_GATV2_BWD=fused \
  --out $OUT --json-out $OUT/bench_ops_gatv2_twitch.json --md $OUT/bench_ops_gatv2_twitch.md > $OUT/bench_ops_twitch.log 2>&1
echo "bench rc=$? $((SECONDS-T0)) s"
grep -E "^\| twitch" $OUT/bench_ops_gatv2_twitch.md | cut -c1-330 | head -8
T0=$SECONDS
timeout 200 python3 -m benchmarks.bench_train --mode full --quick --graphs tolokers,arxiv-like --layers gatv2 --dtypes float32,bfloat16 \
  --json $OUT/bench_train_gatv2.json --markdown $OUT/bench_train_gatv2.md > $OUT/bench_train.log 2>&1
echo "train rc=$? $((SECONDS-T0)) s"
head -30 $OUT/bench_train_gatv2.md
python3 -c "
from gnn_fastpath import tuning
for r in tuning.listing():
    if 'gatv2' in r['class']: print(r['class'][:150], r['choice'], r['times_ms'])
"
