#!/usr/bin/env bash
# One-shot GPU check, offline:
#   benchmarks/gpu_check.sh [OUTDIR]           (default out/gpu-check; PYTHON=python3 unless set)
# The package comes from this source tree (PYTHONPATH); nothing is installed or downloaded. Steps, each
# with a verdict line and a time limit:
#   1. environment (60 s): every module outside the standard library that the steps below import, read
#      from the sources (benchmarks/gpu_imports.py: cupy, cuda-bindings, numba, numpy, pytest today), and
#      the CUDA device
#   2. warm-up (180 s): every CUDA kernel compiled into CuPy's disk cache over all CPUs, and the Numba
#      twin for each KV dtype, so that compile time does not count against step 3
#   3. GPU tests (180 s): pytest -m gpu tests/kernels/test_{cupy,vmm}_gpu.py -> gpu_tests.txt, gpu_tests.xml
#   4. compute-sanitizer memcheck, racecheck, initcheck, synccheck (60 s each) over every kernel on small
#      shapes with CuPy's memory pool off                           -> sanitizer_<tool>.txt
#   5. bandwidth table (120 s): paged vs contiguous decode vs a read-only stream of the same bytes, beside
#      the spec sheet                                               -> gpu_kernels.csv, gpu_kernels.md
# Everything lands in OUTDIR: gpu_check.log (all output), verdict.txt (one line per step), and per step
# environment.txt, warmup.txt, gpu_tests.txt, ...
# Verdicts: PASS; FAIL (a test or kernel error); ENV (a module is missing: nothing ran, nothing is said
# about the kernels; the check stops there); TIME (the step ran past its limit: a hang, or a machine
# slower than budgeted; see the log); TOOL (compute-sanitizer is missing, refused the device or died: no
# statement about the kernels); SKIP (no CUDA device: the step could not run).
# Exit status, the first that applies: 1 any FAIL, 4 ENV, 5 any TIME, 2 any TOOL, 3 GPU steps skipped,
# 0 all PASS.
# Budget: the limits add up to 13 minutes, which only a run of hung steps reaches; a healthy run is
# expected to take about 4 (about 170 kernels at 1.3-2.1 s of NVRTC each, spread over the CPUs, then
# tests that find every kernel compiled). That estimate has not met a GPU yet: read the log's times.
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

limited() {  # SECONDS COMMAND...: the command, killed 10 s after a TERM at the limit (exit 124 or 137)
  local seconds=$1
  shift
  timeout -k 10 "$seconds" "$@"
}

timed_out() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }

echo "== 1. environment ($(date -u +%FT%TZ), $PY, source tree $PWD)"
limited 30 "$PY" benchmarks/gpu_imports.py >"$OUT/environment.txt" 2>&1
rc=$?
cat "$OUT/environment.txt"
if timed_out $rc; then
  verdict environment TIME "listing the modules took over 30 s"
  exit 5
elif [ $rc -eq 4 ]; then
  verdict environment ENV "$(grep -o 'missing: .*' "$OUT/environment.txt" | tail -n 1) (who imports them: environment.txt)"
  echo "the check stops here: install what is missing into $PY and run it again"
  exit 4
elif [ $rc -ne 0 ]; then  # e.g. a Python older than 3.10 (no sys.stdlib_module_names): still no kernel verdict
  verdict environment ENV "benchmarks/gpu_imports.py cannot run with $PY (exit $rc, see environment.txt)"
  exit 4
fi
device=$(limited 30 "$PY" -c "import cupy; print(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode())" 2>&1)
rc=$?
device=$(printf '%s\n' "$device" | tail -n 1)
gpu_ok=0
if timed_out $rc; then
  verdict environment TIME "the CUDA device query hung for 30 s: $device"
elif [ $rc -ne 0 ]; then
  verdict environment SKIP "no CUDA device visible to CuPy: $device"
else
  gpu_ok=1
  verdict environment PASS "$device"
  command -v nvidia-smi >/dev/null && limited 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
fi

echo "== 2. warm-up: compile every kernel before the timed steps"
if [ "$gpu_ok" = 1 ]; then
  limited 180 "$PY" benchmarks/gpu_warmup.py >"$OUT/warmup.txt" 2>&1
  rc=$?
  tail -n 15 "$OUT/warmup.txt"
  if [ $rc -eq 0 ]; then
    verdict warm-up PASS "$(tail -n 1 "$OUT/warmup.txt")"
  elif timed_out $rc; then
    verdict warm-up TIME "not done after 180 s: step 3 compiles the rest itself"
  else
    verdict warm-up FAIL "exit $rc: $(grep -E '^[A-Za-z.]*(Error|Exception)' "$OUT/warmup.txt" | tail -n 1)"
  fi
else
  verdict warm-up SKIP "no CUDA device"
fi

echo "== 3. GPU tests"
if [ "$gpu_ok" = 1 ]; then
  limited 180 "$PY" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
    tests/kernels/test_cupy_gpu.py tests/kernels/test_vmm_gpu.py >"$OUT/gpu_tests.txt" 2>&1
  rc=$?
  tail -n 15 "$OUT/gpu_tests.txt"
  if [ $rc -eq 0 ] && grep -qE '[0-9]+ passed' "$OUT/gpu_tests.txt" && ! grep -qE '[0-9]+ skipped' "$OUT/gpu_tests.txt"; then
    verdict gpu-tests PASS "$(tail -n 1 "$OUT/gpu_tests.txt")"
  elif [ $rc -eq 0 ]; then  # a skip here means a module or the device went missing after step 1
    verdict gpu-tests FAIL "tests were skipped on a GPU machine: $(tail -n 1 "$OUT/gpu_tests.txt")"
  elif timed_out $rc; then
    verdict gpu-tests TIME "not done after 180 s (gpu_tests.txt shows how far it got)"
  else
    verdict gpu-tests FAIL "pytest exit $rc: $(tail -n 1 "$OUT/gpu_tests.txt")"
  fi
else
  verdict gpu-tests SKIP "no CUDA device"
fi

echo "== 4. compute-sanitizer"
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
  limited 60 "$SANITIZER" --tool "$tool" "${extra[@]}" --error-exitcode 3 \
    "$PY" benchmarks/bench_gpu_kernels.py --small >"$log" 2>&1
  rc=$?
  tail -n 2 "$log"
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
  if [ $rc -eq 0 ] && grep -q "small run: every kernel launched" "$log"; then
    verdict "sanitizer-$tool" PASS "${summary:-no errors}"
  elif [ $rc -eq 3 ]; then
    verdict "sanitizer-$tool" FAIL "kernel errors: $summary"
  elif timed_out $rc; then
    verdict "sanitizer-$tool" TIME "not done after 60 s"
  elif grep -q "Traceback" "$log"; then
    raised=$(grep -E '^[A-Za-z.]*(Error|Exception)' "$log" | tail -n 1)
    verdict "sanitizer-$tool" FAIL "the workload raised under the tool: $raised"
  else
    why=$(grep -m1 -iE 'error|not supported' "$log")
    verdict "sanitizer-$tool" TOOL "exit $rc without a kernel error report: $why"
  fi
done

echo "== 5. bandwidth table"
if [ "$gpu_ok" = 1 ]; then
  limited 120 "$PY" benchmarks/bench_gpu_kernels.py --out "$OUT"
  rc=$?
  if [ $rc -eq 0 ] && [ -s "$OUT/gpu_kernels.csv" ]; then
    verdict bandwidth-table PASS "$OUT/gpu_kernels.md"
  elif timed_out $rc; then
    verdict bandwidth-table TIME "not done after 120 s"
  else
    verdict bandwidth-table FAIL "exit $rc"
  fi
else
  verdict bandwidth-table SKIP "no CUDA device"
fi

echo "== verdict ($OUT/verdict.txt)"
cat "$OUT/verdict.txt"
if grep -q ' FAIL ' "$OUT/verdict.txt"; then exit 1; fi
if grep -q ' TIME ' "$OUT/verdict.txt"; then exit 5; fi
if grep -q ' TOOL ' "$OUT/verdict.txt"; then exit 2; fi
if grep -q ' SKIP ' "$OUT/verdict.txt"; then
  echo "GPU steps were SKIPPED: this is not a GPU verdict"
  exit 3
fi
exit 0
