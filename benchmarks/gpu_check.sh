#!/usr/bin/env bash
# GPU check for a machine with a CUDA GPU and the `gpu` extra installed; under 5 minutes on an H200.
#   benchmarks/gpu_check.sh OUTDIR
# 1. the GPU tests (cupy against the reference and against numba)      -> OUTDIR/gpu_tests.txt
# 2. compute-sanitizer memcheck and racecheck over every kernel on small shapes, where installed
#                                                                       -> OUTDIR/sanitizer_{memcheck,racecheck}.txt
# 3. the bandwidth table: paged vs contiguous decode vs a device copy   -> OUTDIR/gpu_kernels.{md,csv}
# Exits non-zero when any step fails; later steps still run.
set -uo pipefail
OUT=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PY=${PYTHON:-.venv/bin/python}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.cache/numba}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
status=0

echo "== device"
"$PY" -c "import cupy; p = cupy.cuda.runtime.getDeviceProperties(0); print('cupy', cupy.__version__, p['name'].decode())" \
  2>&1 | tee "$OUT/device.txt"

echo "== GPU tests"
timeout 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_cupy_gpu.py tests/kernels/test_vmm_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== compute-sanitizer"
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [ -x "$SANITIZER" ]; then
  for tool in memcheck racecheck; do
    timeout 75 "$SANITIZER" --tool "$tool" --error-exitcode 3 "$PY" benchmarks/bench_gpu_kernels.py --small \
      >"$OUT/sanitizer_$tool.txt" 2>&1 || status=1
    tail -n 3 "$OUT/sanitizer_$tool.txt"
  done
else
  echo "compute-sanitizer not found: skipped" | tee "$OUT/sanitizer_skipped.txt"
fi

echo "== bandwidth table"
timeout 90 "$PY" benchmarks/bench_gpu_kernels.py --out "$OUT" || status=1
exit $status
