#!/usr/bin/env bash
# One-shot GPU check, offline, under 8 minutes on an H200:
#   benchmarks/gpu_check.sh [OUTDIR]           (default out/gpu-check; PYTHON=python3 unless set)
# The package comes from this source tree (PYTHONPATH); nothing is installed or downloaded. Needs
# numpy, numba, cupy, pytest, hypothesis (no dask). Steps, each with a verdict line:
#   1. environment: imports, the CUDA device, and that the GPU path does not import dask
#   2. GPU tests: pytest -m gpu tests/kernels/test_{cupy,vmm}_gpu.py -> gpu_tests.txt, gpu_tests.xml
#   3. compute-sanitizer memcheck, racecheck, initcheck, synccheck over every kernel on small
#      shapes with CuPy's memory pool off                           -> sanitizer_<tool>.txt
#   4. bandwidth table: paged vs contiguous decode vs a read-only stream of the same bytes, beside
#      the spec sheet                                               -> gpu_kernels.csv, gpu_kernels.md
# Everything lands in OUTDIR: gpu_check.log (all output), verdict.txt (one line per step).
# Verdicts: PASS; FAIL (a test or kernel error); TOOL (the tool is missing, refused the device or
# died: no statement about the kernels); SKIP (no CUDA device: the step could not run).
# Exit status: 0 all PASS, 1 any FAIL, 2 any TOOL (and no FAIL), 3 GPU steps skipped.
# Step limits (150 + 4 x 45 + 120 s) keep the whole run under 8 minutes even when a step hangs.
set -uo pipefail
OUT=${1:-out/gpu-check}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.cache/numba}
export MPLBACKEND=Agg
LOG=$OUT/gpu_check.log
: >"$LOG"
: >"$OUT/verdict.txt"
exec > >(tee -a "$LOG") 2>&1

verdict() {  # STEP VERDICT REASON
  printf '%-24s %-5s %s\n' "$1" "$2" "$3" | tee -a "$OUT/verdict.txt"
}

echo "== 1. environment ($(date -u +%FT%TZ), $PY, source tree $PWD)"
"$PY" - <<'EOF'
import importlib, sys
for name in ("numpy", "numba", "pytest", "hypothesis", "cupy", "cuda.bindings"):
    try:
        module = importlib.import_module(name)
        print(f"  {name:<14} {getattr(module, '__version__', '?')}")
    except Exception as exc:
        print(f"  {name:<14} MISSING ({type(exc).__name__}: {exc})")
import workbench.kernels, workbench.kernels.reference  # noqa: E401  the CPU side of the GPU tests
try:
    import workbench.kernels.cupy_backend  # noqa: F401
except Exception as exc:
    print(f"  cupy backend   not importable ({type(exc).__name__}: {exc})")
from workbench.kernels import source
print("  CUDA headers for NVRTC:", [str(p) for p in source.cuda_include_dirs()] or "none found")
pulled = sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed"))
print("  dask imported by the GPU path:", pulled or "no")
sys.exit(4 if pulled else 0)
EOF
env_rc=$?
device=$("$PY" -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())" 2>&1 | tail -n 1)
gpu_ok=$("$PY" -c "import cupy; print(int(cupy.cuda.runtime.getDeviceCount() > 0))" 2>/dev/null || echo 0)
if [ "$env_rc" -eq 4 ]; then
  verdict environment FAIL "the GPU path imports dask (see the log)"
elif [ "$env_rc" -ne 0 ]; then
  verdict environment FAIL "the package does not import from the source tree with $PY (see the log)"
elif [ "$gpu_ok" != 1 ]; then
  verdict environment SKIP "no CUDA device visible to CuPy: $device"
else
  verdict environment PASS "$device"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
fi

echo "== 2. GPU tests"
if [ "$gpu_ok" = 1 ]; then
  timeout 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
    tests/kernels/test_cupy_gpu.py tests/kernels/test_vmm_gpu.py >"$OUT/gpu_tests.txt" 2>&1
  rc=$?
  tail -n 15 "$OUT/gpu_tests.txt"
  case $rc in
    0) verdict gpu-tests PASS "$(tail -n 1 "$OUT/gpu_tests.txt")" ;;
    124) verdict gpu-tests FAIL "timed out after 150 s" ;;
    *) verdict gpu-tests FAIL "pytest exit $rc: $(tail -n 1 "$OUT/gpu_tests.txt")" ;;
  esac
else
  verdict gpu-tests SKIP "no CUDA device"
fi

echo "== 3. compute-sanitizer"
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
for tool in memcheck racecheck initcheck synccheck; do
  log=$OUT/sanitizer_$tool.txt
  if [ "$gpu_ok" != 1 ]; then
    verdict "sanitizer-$tool" SKIP "no CUDA device$([ -x "$SANITIZER" ] || echo "; compute-sanitizer not found either")"
    continue
  fi
  if [ ! -x "$SANITIZER" ]; then
    verdict "sanitizer-$tool" TOOL "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)"
    continue
  fi
  extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check no --check-device-heap yes)
  timeout 45 "$SANITIZER" --tool "$tool" "${extra[@]}" --error-exitcode 3 \
    "$PY" benchmarks/bench_gpu_kernels.py --small >"$log" 2>&1
  rc=$?
  tail -n 2 "$log"
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
  if [ $rc -eq 0 ] && grep -q "small run: every kernel launched" "$log"; then
    verdict "sanitizer-$tool" PASS "${summary:-no errors}"
  elif [ $rc -eq 3 ]; then
    verdict "sanitizer-$tool" FAIL "kernel errors: $summary"
  elif grep -q "Traceback" "$log"; then
    raised=$(grep -E '^[A-Za-z.]*(Error|Exception)' "$log" | tail -n 1)
    verdict "sanitizer-$tool" FAIL "the workload raised under the tool: $raised"
  elif [ $rc -eq 124 ]; then
    verdict "sanitizer-$tool" TOOL "timed out after 45 s"
  else
    why=$(grep -m1 -iE 'error|not supported' "$log")
    verdict "sanitizer-$tool" TOOL "exit $rc without a kernel error report: $why"
  fi
done

echo "== 4. bandwidth table"
if [ "$gpu_ok" = 1 ]; then
  timeout 120 "$PY" benchmarks/bench_gpu_kernels.py --out "$OUT"
  rc=$?
  if [ $rc -eq 0 ] && [ -s "$OUT/gpu_kernels.csv" ]; then
    verdict bandwidth-table PASS "$OUT/gpu_kernels.md"
  else
    verdict bandwidth-table FAIL "exit $rc"
  fi
else
  verdict bandwidth-table SKIP "no CUDA device"
fi

echo "== verdict ($OUT/verdict.txt)"
cat "$OUT/verdict.txt"
if grep -q ' FAIL ' "$OUT/verdict.txt"; then exit 1; fi
if grep -q ' TOOL ' "$OUT/verdict.txt"; then exit 2; fi
if grep -q ' SKIP ' "$OUT/verdict.txt"; then
  echo "GPU steps were SKIPPED: this is not a GPU verdict"
  exit 3
fi
exit 0
