set -u
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.txt 2>&1 || { echo install failed; tail -20 $OUT/install.txt; }
export GNN_FASTPATH_DATA=$PWD/.data GNN_FASTPATH_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$SECONDS
timeout ${BENCH_S:-230} python3 -m benchmarks.bench_ops --quick --graphs ${GRAPHS:-tolokers,roads-like,clustered} --ops gatv2_attention --dtypes float32,bfloat16 --no-reference \
  --variant GNN_FASTPATH_GATV2_BWD=atomic --variant GNN_FASTPATH_GATV2_BWD=transposed --variant GNN_FASTPATH_GATV2_BWD=fused \
  --out $OUT --json-out $OUT/bench_ops_gatv2.json --md $OUT/bench_ops_gatv2.md > $OUT/bench_ops_gatv2.log 2>&1
echo "bench rc=$? $((SECONDS-T0)) s"
grep -E "^\|" $OUT/bench_ops_gatv2.md | cut -c1-200 | head -40
T0=$SECONDS
timeout ${TEST_S:-320} python3 -m pytest ${TESTS:-tests/cuda/test_gatv2_kernels.py tests/cuda/test_gatv2_attention_half.py tests/cuda/test_tuning_kernels.py tests/cuda/test_undirected_backward.py tests/cuda/test_gat_kernels.py tests/cuda/test_gat_attention_half.py} -m cuda -q -p no:cacheprovider -n 6 -x > $OUT/pytest.txt 2>&1
echo "pytest rc=$? $((SECONDS-T0)) s"
grep -E "passed|failed|Error|error" $OUT/pytest.txt | tail -15
