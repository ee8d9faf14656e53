#!/usr/bin/env bash
# nablax's GPU checks in one run, each part under its own time limit, logs in $OUT (default
# ./gpu_results): the kernel benchmark (attention and matmul against cuDNN, XLA and PyTorch), the
# GPT benchmark (small and 6-layer models), and the test suite on the GPU.
#
#   bash bench/gpu_checks.sh              # about 9 minutes at most with the default limits
#   GPU_TESTS_S=0 bash bench/gpu_checks.sh   # benchmarks only
#
# Limits in seconds (0 skips the part): GPU_BENCH_S (bench_gpu.py, default 150), GPT_SMALL_S
# (default 60), GPT_LARGE_S (default 150), GPU_TESTS_S (the suite, default 180). Run it from the
# repository root, with nablax installed or PYTHONPATH=src. Without a GPU it says so and stops.
set -u
OUT=${OUT:-gpu_results}
PY=${PYTHON:-python}
export XLA_PYTHON_CLIENT_PREALLOCATE=false # the suite's workers share one GPU

if ! "$PY" -c "import jax, sys; sys.exit(0 if jax.default_backend() == 'gpu' else 1)"; then
    echo "gpu_checks: JAX sees no GPU here ($("$PY" -c 'import jax; print(jax.devices())' 2>&1 | tail -1))"
    exit 2
fi
mkdir -p "$OUT"
# The compiled graph walks (src/nablax/core/_graphc.c), built in place when the machine has a C
# compiler and the Python headers; otherwise nablax runs the pure-Python ones (said below).
"$PY" setup.py -q build_ext --inplace >"$OUT/build_ext.txt" 2>&1 || echo "gpu_checks: C extension not built (see $OUT/build_ext.txt)"
{ "$PY" -c "from nablax.core import graph; print('graph walks', 'compiled' if graph.COMPILED else 'pure Python')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  "$PY" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>/dev/null
} | tee "$OUT/environment.txt"

part() { # name, limit, command...
    local name=$1 limit=$2
    shift 2
    if [ "$limit" = 0 ]; then
        echo "== $name: skipped"
        return
    fi
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s (limit $limit s; 124: ran out of time)"
    tail -n 40 "$OUT/$name.txt"
}

part bench_gpu "${GPU_BENCH_S:-150}" "$PY" bench/bench_gpu.py
part bench_gpt_small "${GPT_SMALL_S:-60}" "$PY" bench/bench_gpt.py --device gpu --quick --no-torch-compile
part bench_gpt_large "${GPT_LARGE_S:-150}" "$PY" bench/bench_gpt.py --device gpu --model large --quick --no-torch-compile
workers=()
if "$PY" -c "import xdist" 2>/dev/null; then
    workers=(-n 4)
fi
part tests "${GPU_TESTS_S:-180}" "$PY" -m pytest -q -p no:cacheprovider "${workers[@]}" tests
