#!/usr/bin/env bash
# One call on a GPU machine that has CUDA PyTorch but no package index (the H200 host): install the
# carried wheels, build every kernel, then run the requested steps, writing logs and results to OUTDIR.
#   scripts/gpu_session.sh OUTDIR STEP...
#   STEP[@SECONDS]:
#     build          every kernel version, the training modules (forward with lse, backward) and the variants
#                    of the sweeps in $SWEEPS (default: "v7 v8"; ptxas reports too), all compilers in parallel
#     tests          the whole suite but the sanitizer tests, -n $XDIST (default 8) workers, JUnit XML
#                    -> results/h200/pytest_junit.xml
#     part:NAME      one part of the whole suite (sanitizer tests included), -n $XDIST workers (default 16),
#                    stopped by SIGINT at its limit so that pytest still writes its summary and JUnit XML
#                    -> results/h200/junit/NAME.xml. The parts: hopper-backward (tests/test_v8_backward.py,
#                    test_backward_choice.py, test_backward_hopper_notes.py: 500 s with 16 workers), rest1 and
#                    rest2 (every other file, alternately); one call each
#     junit          results/h200/junit/*.xml -> results/h200/pytest_junit.xml, one file for the README
#     sanitizer      every sanitizer test (tests -k sanitizer), -n $XDIST workers
#     nbval          the book's checked outputs, live, one notebook per worker (-n 6 --dist loadfile)
#     suite          tests (sanitizer tests included, one JUnit XML for the whole suite) and nbval at the
#                    same time: pytest -n $XDIST tests, and pytest -n 6 --dist loadfile --nbval-lax book/
#     record         scripts/record_h200.sh bench v5 v6 repeat -> OUTDIR/work/h200 (the forward records)
#     profile        scripts/record_h200.sh profile -> OUTDIR/work/h200
#     record-new     scripts/record_h200.sh new -> results/h200: bench_v7, bench_backward, train_demo,
#                    v7_sweep and the v7 / v6_backward profiles, written straight into the tree
#     rec:A,B        scripts/record_h200.sh results/h200 A B (any of its steps), straight into the tree
#     record-v8      scripts/record_h200.sh new-v8 -> results/h200: bench_v8 (V8's targets), v8_sweep and
#                    the v8 profiles at both shapes, written straight into the tree
#     sweep-VERSION  python -m flashattn.measure.sweep VERSION -> OUTDIR/work/h200
#     notebooks      execute every notebook of book/ in place
#     notebooks:A,B  execute book/A.ipynb, book/B.ipynb in place, in that order; notebooks-new = v7,backward,results
#     fa4            stage FlashAttention-4 (../shared/fa4-wheels.sh DIR, carried as fa4/1, fa4/2, ... one or more
#                    per call) in /tmp/fa4: each call copies the parts it carries; the call that carries the folder
#                    with the wheels unpacks them into /tmp/fa4site, which every later step and call imports from
#                    (the machine must stay warm in between: it goes back 30 s after a call)
#     <bash code>    anything else runs as a command
# After each step, OUTDIR/session.tar.gz packs the logs (OUTDIR/work) and OUTDIR/records.tar.gz every file
# under results/h200 and book/*.ipynb that this session wrote or changed (paths relative to the repository
# root: unpack it there with `tar -xzf records.tar.gz`). The copy of the tree on such a machine has no .git,
# or a stale one: set FLASHATTN_GIT_COMMIT to the commit sent, for the JSON records (it takes precedence
# over git).
# Examples (the calls behind results/h200; each step's limit is its @SECONDS):
#   scripts/gpu_session.sh $OUT build@150 record-new@270 notebooks-new@170
#   scripts/gpu_session.sh $OUT build@90 suite@500
set -uo pipefail
OUT=${1:?usage: scripts/gpu_session.sh OUTDIR STEP...}; shift
cd "$(dirname "$0")/.."
mkdir -p "$OUT/work"; W=$OUT/work
# the carried wheels: .whl (the notebook stack, 30 MB), or WHEELS=DIR, e.g. the tests' share of it
# (scripts/slim_wheels.sh .whl .whl-tests: nbformat and IPython, 3 MB)
WHEELS=${WHEELS:-.whl}
if [ -d "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} JUPYTER_PATH=/tmp/site/share/jupyter PATH=/tmp/site/bin:$PATH
  python3 -m ipykernel install --prefix /tmp/site --name python3 >/dev/null 2>&1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# the report readers' ncu_report: from the wheels if carried, else the one Nsight Compute ships beside itself
if ! python3 -c "import ncu_report" 2>/dev/null; then
  nr=$(find "$(dirname "$(readlink -f "$(command -v ncu)")")/.." /usr/local/cuda/ /opt/nvidia -name ncu_report.py \
         -path '*extras/python*' 2>/dev/null | head -1)
  if [ -n "$nr" ]; then export PYTHONPATH=$PYTHONPATH:$(dirname "$nr"); else echo "ncu_report: not found"; fi
fi
suite_files() {   # suite_files PART: the test files of one part of the suite (part:NAME)
  local trio='tests/test_(v8_backward|backward_choice|backward_hopper_notes)\.py'
  case $1 in
    hopper-backward) ls tests/test_*.py | grep -E "$trio" ;;
    rest1) ls tests/test_*.py | grep -v -E "$trio" | awk 'NR % 2 == 1' ;;
    rest2) ls tests/test_*.py | grep -v -E "$trio" | awk 'NR % 2 == 0' ;;
    *) echo "unknown part $1 (hopper-backward, rest1, rest2)" >&2; return 1 ;;
  esac
}
fa4_path() {   # PYTHONPATH gains the staged FlashAttention-4 once, however often this runs
  [ -d /tmp/fa4site/flash_attn ] || return 1
  case ":$PYTHONPATH:" in *:/tmp/fa4site:*) ;; *) export PYTHONPATH=$PYTHONPATH:/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages ;; esac
}
fa4_path   # staged by an earlier call on this warm machine
# inside the tree's ignored build/ folder: a warm machine keeps it from one call to the next
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/build/torch_ext}
t0=$(date +%s)
touch "$W/.start"
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
pack() {
  tar -C "$OUT" -czf "$OUT/session.tar.gz" work
  find results/h200 results/h200x2 book -maxdepth 2 -type f -newer "$W/.start" \
    \( -path 'results/h200/*' -o -path 'results/h200x2/*' -o -name '*.ipynb' \) \
    ! -path '*/.ipynb_checkpoints/*' 2>/dev/null | sort > "$W/records.list"
  tar -czf "$OUT/records.tar.gz" -T "$W/records.list"
}
notebooks() {  # notebooks LOG NAME... : execute book/NAME.ipynb in place, one after another
  local log=$1 paths=() n; shift
  for n in "$@"; do
    if [ -f "book/$n.ipynb" ]; then paths+=("book/$n.ipynb"); else echo "notebooks: book/$n.ipynb does not exist, skipped"; fi
  done
  [ ${#paths[@]} -gt 0 ] || return 0
  $T python3 scripts/execute_notebooks.py "${paths[@]}" > "$W/$log" 2>&1
  echo "notebooks rc=$?"; tail -15 "$W/$log"
}
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
    done
    for v in $(python3 -c "from flashattn.autograd import TRAINING_VERSIONS; print(*TRAINING_VERSIONS)"); do
      ( python3 -c "import time; from flashattn.autograd import forward_module as f, backward_module as b; t=time.time(); f('$v'); b('$v'); print('$v training modules built in %.1f s' % (time.time()-t))" \
          > "$W/build_${v}_train.log" 2>&1 || echo "BUILD FAILED ${v} training modules" >> "$W/build_${v}_train.log" ) &
    done
    for v in ${SWEEPS-v7 v8}; do
      ( python3 -m flashattn.measure.sweep "$v" --build-only --jobs "${JOBS:-16}" > "$W/build_sweep_$v.log" 2>&1 \
          || echo "BUILD FAILED sweep $v" >> "$W/build_sweep_$v.log" ) &
    done
    wait; cat "$W"/build_*.log | grep -E "built|FAILED|rror" | head -40 ;;
  tests)  # the JUnit XML lands in results/h200: flashattn.measure.table reads it for the README
    commit=${FLASHATTN_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
    # -v names every test as it finishes: a run cut by its limit still says which failed
    $T python3 -m pytest -v -rfE -p no:cacheprovider -n ${XDIST:-8} tests -k "not sanitizer" \
      --junitxml=results/h200/pytest_junit.xml -o junit_suite_name="flashattn at ${commit:-unknown}" > "$W/pytest.log" 2>&1
    echo "pytest rc=$?"; grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$W/pytest.log" | tail -40 ;;
  suite)  # the GPU is shared by both; nbval checks outputs that do not depend on timings
    commit=${FLASHATTN_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
    $T python3 -m pytest -q -p no:cacheprovider -n 6 --dist loadfile --nbval-lax book/ > "$W/nbval.log" 2>&1 &
    nbval=$!
    $T python3 -m pytest -q -p no:cacheprovider -n ${XDIST:-8} tests \
      --junitxml=results/h200/pytest_junit.xml -o junit_suite_name="flashattn at ${commit:-unknown}" > "$W/pytest.log" 2>&1
    echo "pytest rc=$?"; wait $nbval; echo "nbval rc=$?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$W/pytest.log" | tail -40
    grep -E "^(FAILED|ERROR)|passed|failed" "$W/nbval.log" | tail -20 ;;
  part:*)  # part:NAME: one part of the whole suite; SIGINT at the limit, so pytest writes its JUnit file
    part=${step#part:}; files=$(suite_files "$part") || continue
    commit=${FLASHATTN_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}; mkdir -p results/h200/junit
    timeout -s INT -k 30 "$limit" python3 -m pytest -v -rfE -p no:cacheprovider -n ${XDIST:-16} $files \
      --junitxml="results/h200/junit/$part.xml" -o junit_suite_name="flashattn at ${commit:-unknown}" \
      > "$W/pytest_$part.log" 2>&1
    echo "pytest $part rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|KeyboardInterrupt" "$W/pytest_$part.log" | tail -30 ;;
  junit)
    python3 -m flashattn.measure.table --merge-junit results/h200/junit/*.xml --out results/h200/pytest_junit.xml ;;
  sanitizer)  # tests/test_sanitizer.py (every kernel), and the v7, v8 and backward sanitizer tests
    $T python3 -m pytest -q -p no:cacheprovider -n ${XDIST:-8} tests -k sanitizer > "$W/sanitizer.log" 2>&1
    echo "sanitizer rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$W/sanitizer.log" | tail -20 ;;
  sweep-*)  # python -m flashattn.measure.sweep VERSION: VERSION_sweep.json next to the other records
    v=${step#sweep-}; mkdir -p "$W/h200"
    $T python3 -m flashattn.measure.sweep "$v" --out "$W/h200" > "$W/h200/${v}_sweep.txt" 2>&1; echo "$v sweep rc=$?"
    tail -25 "$W/h200/${v}_sweep.txt" ;;
  record)
    $T bash scripts/record_h200.sh "$W/h200" bench v5 v6 repeat > "$W/record.log" 2>&1; echo "record rc=$?"
    tail -40 "$W/h200/bench.txt"; tail -30 "$W/h200/bench_v5.txt"; tail -30 "$W/h200/bench_v6.txt"
    grep -E "^B=|^  v6 |^  sdpa_flash " "$W/h200/bench_v6_repeat.txt" ;;
  profile)
    $T bash scripts/record_h200.sh "$W/h200" profile > "$W/profile.log" 2>&1; echo "profile rc=$?"; tail -15 "$W/profile.log" ;;
  record-new)  # straight into the tree's results/h200 (records.tar.gz brings them back)
    $T bash scripts/record_h200.sh results/h200 new > "$W/record_new.log" 2>&1; echo "record-new rc=$?"
    grep -E "^!!" "$W/record_new.log"
    grep -E "^B=|^  (v7|v6|v6_deterministic|sdpa|sdpa_flash|sdpa_cudnn) " results/h200/bench_v7.txt results/h200/bench_backward.txt
    tail -12 results/h200/train_demo.txt; tail -22 results/h200/v7_sweep.txt; grep -E "wrote|error" results/h200/profile_new.txt ;;
  record-v8)  # straight into the tree's results/h200, like record-new
    $T bash scripts/record_h200.sh results/h200 new-v8 > "$W/record_v8.log" 2>&1; echo "record-v8 rc=$?"
    grep -E "^!!" "$W/record_v8.log"
    grep -E "^B=|^  (v8|v7|v6|sdpa|sdpa_flash|sdpa_cudnn) " results/h200/bench_v8.txt
    tail -22 results/h200/v8_sweep.txt; grep -E "wrote|error" results/h200/profile_v8.txt ;;
  rec:*)  # rec:STEP,STEP: scripts/record_h200.sh with those steps, straight into the tree's results/h200
    names=${step#rec:}; log="$W/rec_${names//,/_}.log"
    $T bash scripts/record_h200.sh results/h200 ${names//,/ } > "$log" 2>&1; echo "rec $names rc=$?"
    grep -E "^!!" "$log"; grep -E "^B=|^  [a-z0-9_]+ +[0-9,.]+ " "$log" | tail -60 ;;
  notebooks)
    notebooks notebooks.log $(cd book && ls *.ipynb | sed 's/\.ipynb$//') ;;
  notebooks-new)
    notebooks notebooks_new.log v7 backward results ;;
  notebooks:*)
    names=${step#notebooks:}; notebooks "notebooks_${names//,/_}.log" ${names//,/ } ;;
  nbval)
    # one notebook per worker (--dist loadfile): nbval's cells share their notebook's kernel
    $T python3 -m pytest -q -p no:cacheprovider -n 6 --dist loadfile --nbval-lax book/ > "$W/nbval.log" 2>&1
    echo "nbval rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$W/nbval.log" | tail -20 ;;
  fa4)
    mkdir -p /tmp/fa4
    for d in fa4/*/; do cp "$d"part.* /tmp/fa4/ 2>/dev/null && echo "fa4: staged ${d}part.*"; done
    wheels=$(ls fa4/*/*.whl 2>/dev/null | head -1)
    if [ -n "$wheels" ] && [ ! -d /tmp/fa4site/flash_attn ]; then
      mkdir -p /tmp/fa4site && cat /tmp/fa4/part.* | xz -d | tar -x -C /tmp/fa4site && \
        for w in "$(dirname "$wheels")"/*.whl; do python3 -m zipfile -e "$w" /tmp/fa4site; done
      echo "fa4: unpacked rc=$?"
    fi
    fa4_path && python3 -c "from flash_attn.cute import flash_attn_func; print('fa4: flash_attn.cute imports')" ;;
  *) $T bash -c "$step" ;;
  esac
  pack
done
stamp "done"
rm -rf "$W"
