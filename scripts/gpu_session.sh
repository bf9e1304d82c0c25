#!/usr/bin/env bash
# One call on a GPU machine that has CUDA PyTorch but no package index (the H200 host): install the
# carried wheels, build every kernel, then run the requested steps, writing logs and results to OUTDIR.
#   scripts/gpu_session.sh OUTDIR STEP...
#   STEP[@SECONDS]: build | tests | sanitizer | sweep-VERSION (sweep-v5, sweep-v6) | record | profile | notebooks |
#                   nbval | <python code>
# Everything written under OUTDIR is packed into OUTDIR/session.tar.gz after each step. The copy of the
# tree on such a machine has no .git, or a stale one: set FLASHATTN_GIT_COMMIT to the commit sent, for the
# JSON records (it takes precedence over git).
# Example (the H200 runs behind results/h200):
#   scripts/gpu_session.sh $OUT build@120 record@300 profile@170 notebooks@220 tests@150 sanitizer@60 nbval@110
set -uo pipefail
OUT=${1:?usage: scripts/gpu_session.sh OUTDIR STEP...}; shift
cd "$(dirname "$0")/.."
mkdir -p "$OUT/work"; W=$OUT/work
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site JUPYTER_PATH=/tmp/site/share/jupyter PATH=/tmp/site/bin:$PATH
  python3 -m ipykernel install --prefix /tmp/site --name python3 >/dev/null 2>&1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_ext}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
pack() { tar -C "$OUT" -czf "$OUT/session.tar.gz" work; }
for arg in "$@"; do
  step=${arg%@*}; limit=${arg##*@}; [ "$limit" = "$arg" ] && limit=600
  T="timeout -k 10 $limit"
  stamp "step $step (limit ${limit}s)"
  case $step in
  build)  # all kernels in parallel, each in its own process (16 cores)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$W/gpu.txt"
    for v in $(python3 -c "import flashattn; print(*flashattn.KERNEL_VERSIONS)"); do
      ( python3 -c "import flashattn, time; t=time.time(); flashattn.load('$v'); print('$v built in %.1f s' % (time.time()-t))" \
          > "$W/build_$v.log" 2>&1 || echo "BUILD FAILED $v" >> "$W/build_$v.log" ) &
    done; wait; cat "$W"/build_*.log | grep -E "built|FAILED|rror" | head -40 ;;
  tests)  # the JUnit XML lands with the record (work/h200 -> results/h200): flashattn.table reads it for the README
    mkdir -p "$W/h200"; commit=${FLASHATTN_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
    $T python3 -m pytest -q -p no:cacheprovider -n ${XDIST:-4} tests -k "not sanitizer" \
      --junitxml="$W/h200/pytest_junit.xml" -o junit_suite_name="flashattn at ${commit:-unknown}" > "$W/pytest.log" 2>&1
    echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest.log" | tail -40 ;;
  sanitizer)
    $T python3 -m pytest -q -p no:cacheprovider tests/test_sanitizer_gpu.py > "$W/sanitizer.log" 2>&1
    echo "sanitizer rc=$?"; tail -3 "$W/sanitizer.log" ;;
  sweep-*)  # python -m flashattn.sweep VERSION: VERSION_sweep.json next to the other records
    v=${step#sweep-}; mkdir -p "$W/h200"
    $T python3 -m flashattn.sweep "$v" --out "$W/h200" > "$W/h200/${v}_sweep.txt" 2>&1; echo "$v sweep rc=$?"
    tail -25 "$W/h200/${v}_sweep.txt" ;;
  record)
    $T bash scripts/record_h200.sh "$W/h200" bench v5 v6 repeat > "$W/record.log" 2>&1; echo "record rc=$?"
    tail -40 "$W/h200/bench.txt"; tail -30 "$W/h200/bench_v5.txt"; tail -30 "$W/h200/bench_v6.txt"
    grep -E "^B=|^  v6 |^  sdpa_flash " "$W/h200/bench_v6_repeat.txt" ;;
  profile)
    $T bash scripts/record_h200.sh "$W/h200" profile > "$W/profile.log" 2>&1; echo "profile rc=$?"; tail -15 "$W/profile.log" ;;
  notebooks)
    $T python3 scripts/execute_notebooks.py book "$W/book" > "$W/notebooks.log" 2>&1; echo "notebooks rc=$?"; tail -15 "$W/notebooks.log" ;;
  nbval)
    # one notebook per worker (--dist loadfile): nbval's cells share their notebook's kernel
    $T python3 -m pytest -q -p no:cacheprovider -n 5 --dist loadfile --nbval-lax book/ > "$W/nbval.log" 2>&1
    echo "nbval rc=$?"; tail -5 "$W/nbval.log" ;;
  *) $T bash -c "$step" ;;
  esac
  pack
done
stamp "done"
rm -rf "$W"
