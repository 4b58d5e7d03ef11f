mkdir -p /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD; python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export GNN_FASTPATH_DATA=$PWD/.data PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest tests/cuda/test_block_attention.py tests/cuda/test_dot_attention_half.py tests/cuda/test_dot_kernels.py tests/cuda/test_launch.py -m cuda -q -p no:cacheprovider -n 6 2>&1 | tail -2 | tee $OUT/pytest_block_dot.txt
SANITIZE_OPS=dot_attention SANITIZE_DTYPES=bfloat16,float16 SANITIZE_STATIC=0 SANITIZE_COMPARE=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 86 --target-processes all python3 benchmarks/sanitize_small.py > /tmp/mc.txt 2>&1; echo "memcheck rc=$? cases $(grep -c '^OK' /tmp/mc.txt)"; tail -1 /tmp/mc.txt | tee $OUT/memcheck_dot.txt
timeout 170 python3 -m benchmarks.bench_train --mode full --graphs tolokers,arxiv-like --dtypes float32,bfloat16 --quick --json $OUT/train_full.json --markdown $OUT/train_full.md > /tmp/tf.log 2>&1 || { echo "full failed"; tail -3 /tmp/tf.log; }
timeout 150 python3 -m benchmarks.bench_train --mode sampled --sampled-graphs arxiv-like --samplers pyg --batch-sizes 1024 --dtypes float32,bfloat16 --no-whole --quick --json $OUT/train_sampled.json --markdown $OUT/train_sampled.md > /tmp/ts.log 2>&1 || { echo "sampled failed"; tail -3 /tmp/ts.log; }
ls $OUT
