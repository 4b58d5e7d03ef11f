set -u
mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > /tmp/install.txt 2>&1 || { echo install failed; tail -20 /tmp/install.txt; }
export GNN_FASTPATH_DATA=$PWD/.data GNN_FASTPATH_COMMIT=${COMMIT:-unknown} PYTHONUNBUFFERED=1
T0=$SECONDS
timeout 330 python3 -m pytest tests -m cuda -q -p no:cacheprovider -n 6 > $OUT/pytest_cuda.txt 2>&1
echo "pytest rc=$? $((SECONDS-T0)) s"; grep -E "passed|failed|FAILED|Error" $OUT/pytest_cuda.txt | tail -12
T0=$SECONDS
SANITIZE_OPS=dot_attention SANITIZE_DTYPES=float16,bfloat16 SANITIZE_STATIC=0 SANITIZE_COMPARE=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 86 --target-processes all python3 benchmarks/sanitize_small.py > $OUT/memcheck_dot.txt 2>&1
echo "memcheck rc=$? $((SECONDS-T0)) s"; grep -c "^OK" $OUT/memcheck_dot.txt; grep -c "block" $OUT/memcheck_dot.txt; tail -2 $OUT/memcheck_dot.txt
T0=$SECONDS
timeout 120 python3 -m benchmarks.bench_ops --quick --graphs tolokers,clustered --ops dot_attention --dtypes bfloat16,float16 --no-reference \
  --variant "GNN_FASTPATH_DOT_FWD=block GNN_FASTPATH_DOT_BWD=block" --variant "GNN_FASTPATH_DOT_FWD=csr GNN_FASTPATH_DOT_BWD=transposed" \
  --out $OUT --json-out $OUT/bench_ops_dot16.json --md $OUT/bench_ops_dot16.md > /tmp/bench_dot.log 2>&1
echo "bench rc=$? $((SECONDS-T0)) s"
grep -E "^\| (tolokers|clustered)" $OUT/bench_ops_dot16.md | cut -c1-400 | head -12
