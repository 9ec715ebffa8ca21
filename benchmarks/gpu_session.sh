#!/usr/bin/env bash
# Every check of minicaffe's GPU path that needs a real NVIDIA GPU, in one call, sized to fit
# about ten minutes of device time; each part has its own time limit, and a part that fails or
# runs out of time does not stop the others.  Tables and logs go to $OUT (default
# ./gpu_session_out), at most eight files:
#
#   env.txt          versions, nvidia-smi, python -m minicaffe.gpu_check
#   gpu_step.txt     LeNet step: minicaffe eager / device step / CUDA-graph replay vs PyTorch
#                    eager and CUDA graph, batches 64 and 1024, launches per step (+ gpu_step.json)
#   pytest_gpu.txt   pytest -m gpu (the kernel and backend suites' cuda cases, graph replay)
#   gemm.txt         the GEMM ladder against cuBLAS (python -m kernels.cuda.bench --family gemm)
#   layers.txt       the layer tests on the real cuda backend
#   summary.txt      each part's exit status and seconds
#
# Run from the repository root:  bash benchmarks/gpu_session.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_session_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

# numba/CuPy builds older than the machine's numpy may still call numpy.row_stack, which numpy
# 2.4 removed: an alias, loaded at start-up from a folder outside the repository.
SHIM=$(mktemp -d)
cat >"$SHIM/sitecustomize.py" <<'PY'
import numpy

if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack
PY
export PYTHONPATH="$PWD:$SHIM${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0

: >"$OUT/summary.txt"
part() {  # part NAME SECONDS FILE COMMAND...
    local name=$1 limit=$2 file=$3
    shift 3
    local t0=$SECONDS
    echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$OUT/$file"
    timeout "$limit" "$@" >>"$OUT/$file" 2>&1
    local rc=$?
    echo "$name: exit $rc, $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}

{
    date -u
    uname -a
    nvidia-smi 2>&1 | head -20
    $PY -c "import sys, numpy, numba; print(sys.version); print('numpy', numpy.__version__, 'numba', numba.__version__)"
    $PY -m pip list 2>/dev/null | grep -i -E "^(cupy|numba|torch|numpy) " || true
} >"$OUT/env.txt" 2>&1
part gpu_check 120 env.txt $PY -m minicaffe.gpu_check
part gpu_step 240 gpu_step.txt $PY benchmarks/gpu_step.py --steps 100 --warmup 20 --out "$OUT/gpu_step.json"
part pytest_gpu 300 pytest_gpu.txt $PY -m pytest -q -p no:cacheprovider -m gpu tests/
part gemm 150 gemm.txt $PY -m kernels.cuda.bench --family gemm --size 4096
part layers 240 layers.txt $PY -m pytest -q -p no:cacheprovider -k cuda tests/test_layers_neuron.py \
    tests/test_layers_loss.py tests/test_layers_norm.py tests/test_layers_conv.py tests/test_layers_pooling.py \
    tests/test_layers_misc.py tests/test_layers_shape.py
rm -rf "$SHIM"
cat "$OUT/summary.txt"
