#!/usr/bin/env bash
# Every check of minicaffe's GPU path that needs a real NVIDIA GPU, in one call that ends within
# $BUDGET seconds (default 540: a device command may run ten minutes).  The parts run in order of
# importance, each under its own limit cut to the time left; a part that fails or runs out of
# time does not stop the others, and one that no longer fits is skipped and says so.  Tables and logs go to $OUT (default
# ./gpu_session_out), at most eight files:
#
#   env.txt          versions, nvidia-smi; python -m minicaffe.gpu_check (last)
#   gpu_step.txt     LeNet step: minicaffe eager / device step / CUDA-graph replay vs PyTorch
#                    eager and CUDA graph, batches 64 and 1024, launches per step (+ gpu_step.json)
#   pytest_gpu.txt   pytest -m gpu (the kernel and backend suites' cuda cases, graph replay)
#   gemm.txt         the GEMM ladder against cuBLAS at 4096^3 (python -m kernels.cuda.bench --family gemm)
#   layers.txt       the layer tests on the real cuda backend
#   summary.txt      each part's exit status and seconds
#
# Run from the repository root:  bash benchmarks/gpu_session.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_session_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

# numba/CuPy builds older than the machine's numpy may still call numpy.row_stack (deprecated
# since numpy 2.0): where numpy lacks it, an alias, loaded at start-up from a folder outside the
# repository.
SHIM=$(mktemp -d)
cat >"$SHIM/sitecustomize.py" <<'PY'
import numpy

if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack
PY
export PYTHONPATH="$PWD:$SHIM${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0

: >"$OUT/summary.txt"
BUDGET=${BUDGET:-540}
part() {  # part NAME SECONDS FILE COMMAND...
    local name=$1 limit=$2 file=$3
    shift 3
    local left=$((BUDGET - SECONDS - 5))
    if [ "$left" -lt 30 ]; then
        echo "$name: skipped, ${left}s left of the ${BUDGET}s budget" | tee -a "$OUT/summary.txt"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
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
# the LeNet step against PyTorch (each process compiles the engine's kernels once: ~28 per dtype)
part gpu_step 200 gpu_step.txt $PY benchmarks/gpu_step.py --steps 100 --warmup 20 --out "$OUT/gpu_step.json"
# correctness on the device: every gpu-marked case in this process (the suite-in-a-subprocess
# test repeats the kernel and backend cases already selected here: left out)
part pytest_gpu 170 pytest_gpu.txt $PY -m pytest -q -p no:cacheprovider -m gpu tests/ \
    --deselect tests/test_cuda_gpu.py::test_gpu_kernel_and_backend_suites_on_the_device
part gemm 90 gemm.txt $PY -m kernels.cuda.bench --family gemm --gemm-size 4096
part layers 120 layers.txt $PY -m pytest -q -p no:cacheprovider -k cuda tests/test_layers_neuron.py \
    tests/test_layers_loss.py tests/test_layers_norm.py tests/test_layers_conv.py tests/test_layers_pooling.py \
    tests/test_layers_misc.py tests/test_layers_shape.py
part gpu_check 60 env.txt $PY -m minicaffe.gpu_check
rm -rf "$SHIM"
cat "$OUT/summary.txt"
