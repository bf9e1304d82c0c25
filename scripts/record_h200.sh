#!/usr/bin/env bash
# Regenerate the recorded GPU results in one command, on a machine with a CUDA GPU (and ncu for the
# profiles):
#
#   scripts/record_h200.sh OUTDIR [STEP ...]
#     STEP: bench, v5, v6, repeat, profile, figures (the default: all six), and
#           v7, backward, train, sweep-v7, profile-new (the Hopper and training records; `new` = all five),
#           v8, sweep-v8, profile-v8 (the V8 records; `new-v8` = these three)
#
#   bench    every version at M=N 512, 1024, 2048 and 4096 (B=4, H=12, D=64, float32; v6 runs TF32 there)
#              -> OUTDIR/bench.json, bench.txt
#   v5       v4, v5 and SDPA (fp32) at M=N 512 ... 8192, D=64 and D=128 -> OUTDIR/bench_v5.json, bench_v5.txt
#   v6       v6 against SDPA and its forced backends, bf16, causal and not, at B=4,H=12,2048,D=64 and
#            B=2,H=16,8192,D=128, then its TF32 mode on float32 inputs at B=4,H=12,2048,D=64, all in one
#            file -> OUTDIR/bench_v6.json, bench_v6.txt
#   repeat   the bf16 part of v6 (v6, sdpa_flash, sdpa) again in 5 separate processes per shape, with
#            nvidia-smi sampling clocks, power and temperature: how much a ratio moves from run to run
#            -> OUTDIR/bench_v6_repeat.json, bench_v6_repeat.txt, gpu_clocks.csv
#   profile  Nsight Compute report of every fused version at the primary shape, and of v6 (bf16) at
#            B=2,H=16,8192,D=128, with ncu's details and raw pages
#            -> OUTDIR/flash_<v>_s<M>_profile.{ncu-rep,details.csv,details.txt,raw.csv}
#   figures  roofline.png and results_table.md (needs matplotlib and ncu_report; skipped if absent,
#            they can be made later on any machine from the files above)
#   v7       v7 against v6, SDPA (cuDNN by default on Hopper), FlashAttention-2 and cuDNN forced, bf16, causal
#            and not, at B=4,H=12,2048,D=64 and B=2,H=16,8192,D=128 -> OUTDIR/bench_v7.json, bench_v7.txt
#            (about 40 s on the H200 once built)
#   v8       v8 against v7, v6, SDPA (cuDNN by default on Hopper), FlashAttention-2 and cuDNN forced, bf16,
#            causal and not, at the same two shapes -> OUTDIR/bench_v8.json, bench_v8.txt: the V8
#            targets table (about 45 s once built)
#   sweep-v8 python -m flashattn.measure.sweep v8: the V8 chapter's steps at both shapes beside v7, cuDNN and
#            FlashAttention-2 -> OUTDIR/v8_sweep.json, v8_sweep.txt (about 60 s once built)
#   profile-v8 Nsight Compute reports of v8 (bf16) at both shapes -> OUTDIR/flash_v8_s2048_profile.*,
#            flash_v8_s8192_profile.* (about 40 s)
#   backward the gradient call given dO (python -m flashattn.measure.bench --backward: torch.autograd.grad on
#            the output for every column) of v6 (atomic and deterministic dQ) against SDPA, its
#            FlashAttention-2 and cuDNN backends and FlashAttention-4 (where it imports), bf16, the same
#            four configurations -> OUTDIR/bench_backward.json, bench_backward.txt (about 60 s)
#   peers    v8, v7, v6 against SDPA's cuDNN and FlashAttention-2 backends and FlashAttention-4 (where it
#            imports: ../shared/fa4-wheels.sh), bf16, causal and not, at (B,H,N,D) = (4,12,2048,64),
#            (2,16,8192,128), (1,32,4096,128), (16,16,1024,128), (1,8,2048,128)
#            -> OUTDIR/bench_peers.json, bench_peers.txt; then the same columns at B=4,H=12,D=64 over
#            M=N 512 ... 8192 -> OUTDIR/bench_peers_seq.json (about 4 min)
#   v8-defaults V8's default build against a third stage and B_c = 176, three separate processes of 10
#            interleaved rounds each -> OUTDIR/v8_defaults.json (one run per process; about 2 min)
#   backward-dq the dQ step of the backward's key-tile kernel (flashattn.measure.variants, backward-dq: red.global or
#            one bulk reduction per tile, 2 or 3 stages) beside SDPA's FlashAttention-2 and cuDNN backward,
#            the same four configurations, then Nsight Compute on the red and bulk builds with per-instruction
#            stall samples -> OUTDIR/backward_dq.json, backward_dq_ncu.{json,raw.csv,source.csv}
#            (about 90 s once built)
#   backward-tile the next step at D=64: B_r = 128 query rows per tile instead of 64 (flashattn.measure.
#            variants, backward-tile) beside SDPA's FlashAttention-2 and cuDNN backward, the same four configurations (the
#            two builds are one kernel at D=128), then Nsight Compute on both at B=4,H=12,2048,D=64
#            -> OUTDIR/backward_tile.json, backward_tile_ncu.{json,raw.csv} (about 60 s once built)
#   backward-det the deterministic mode's dK/dV kernel (flashattn.measure.variants, backward-det: the 4-warp bwd_dkdv or
#            bwd_dkdv_split without its dQ step), both in deterministic mode beside the atomic mode, SDPA's
#            FlashAttention-2 and cuDNN backward, the same four configurations -> OUTDIR/backward_det.json
#            (about 60 s once built)
#   backward-repeat the backward of v6 beside FlashAttention-2 (sdpa_flash) again, non-causal at both shapes,
#            in 5 separate processes: how much the target table's ratios move from run to run
#            -> OUTDIR/bench_backward_repeat.json, bench_backward_repeat.txt (about 100 s)
#   train    the training demonstration, 300 steps of each attention from one seed
#            -> OUTDIR/train_demo.json, train_demo.txt (about 60 s)
#   sweep-v7 python -m flashattn.measure.sweep v7: every step variant of the chapter at both shapes, one interleaved
#            run per head dim -> OUTDIR/v7_sweep.json, v7_sweep.txt (about 40 s when the variants are
#            built already, by gpu_session.sh's build step; 2-3 min more otherwise)
#   profile-new Nsight Compute reports of v7 (bf16) at both shapes and of v6's backward (its dK/dV kernel,
#            bf16, primary shape) -> OUTDIR/flash_v7_s2048_profile.*, flash_v7_s8192_profile.*,
#            flash_v6_backward_s2048_profile.* (about 60 s)
#
# Also writes the git commit, nvidia-smi and ncu versions. Steps may be run in separate calls (each one
# stays within a few minutes once the kernels are built). PYTHON picks the interpreter (default python3).
set -uo pipefail
OUT=${1:?usage: scripts/record_h200.sh OUTDIR [STEP ...] (see the comment at the top)}
shift
STEPS=${*:-bench v5 v6 repeat profile figures}
STEPS=$(for s in $STEPS; do
  case $s in new) echo v7 backward train sweep-v7 profile-new ;; new-v8) echo v8 sweep-v8 profile-v8 ;; *) echo "$s" ;; esac
done)
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
status=0

run() {   # run LOG CMD...: echo, run, append output to LOG, remember failures
    local log=$1; shift
    echo "+ $*" | tee -a "$OUT/$log"
    "$@" 2>&1 | tee -a "$OUT/$log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || { echo "!! exit $rc: $*" | tee -a "$OUT/$log"; status=1; }
}

ncu_version() {   # the Nsight Compute version beside the reports it made
    local ncu
    ncu=$($PY -c "from flashattn.measure.profile import find_ncu; print(find_ncu() or '')")
    if [ -n "$ncu" ]; then "$ncu" --version > "$OUT/ncu_version.txt" 2>&1; fi
}
targets() {   # targets NAME BENCH-ARGS...: the four configurations of the tensor-core targets in bf16
    # (B=4,H=12,M=N=2048,D=64 and B=2,H=16,M=N=8192,D=128, each non-causal and causal), one file NAME.json
    local name=$1 causal; shift
    rm -f "$OUT/$name.json" "$OUT/$name.txt"
    for causal in "" "--causal"; do
        run "$name.txt" $PY -m flashattn.measure.bench "$@" --dtype bfloat16 -B 4 -H 12 -D 64 --seq-lens 2048 $causal \
            --json "$OUT/$name.json" --append
        run "$name.txt" $PY -m flashattn.measure.bench "$@" --dtype bfloat16 -B 2 -H 16 -D 128 --seq-lens 8192 $causal \
            --json "$OUT/$name.json" --append
    done
}

if [ -n "${FLASHATTN_GIT_COMMIT:-}" ]; then   # a copied tree: the caller's commit wins over any .git there
  echo "$FLASHATTN_GIT_COMMIT (FLASHATTN_GIT_COMMIT: tree copied to the GPU machine)" > "$OUT/git_commit.txt"
else
  { git rev-parse HEAD 2>/dev/null || echo "no commit"
    git status --porcelain --untracked-files=no 2>/dev/null; } > "$OUT/git_commit.txt"
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
$PY -c "import torch; print(torch.__version__, torch.version.cuda)" > "$OUT/torch_version.txt" 2>&1 || true

for step in $STEPS; do
    case $step in
    bench)
        rm -f "$OUT/bench.json" "$OUT/bench.txt"
        run bench.txt $PY -m flashattn.measure.bench all --seq-lens 512 1024 2048 4096 --json "$OUT/bench.json"
        ;;
    v5)
        rm -f "$OUT/bench_v5.json" "$OUT/bench_v5.txt"
        run bench_v5.txt $PY -m flashattn.measure.bench v4 v5 sdpa --seq-lens 512 1024 2048 4096 8192 \
            --json "$OUT/bench_v5.json" --append
        run bench_v5.txt $PY -m flashattn.measure.bench v4 v5 sdpa -D 128 --seq-lens 512 1024 2048 4096 8192 \
            --json "$OUT/bench_v5.json" --append
        ;;
    v6)
        targets bench_v6 v6 baseline sdpa sdpa_flash sdpa_cudnn sdpa_efficient
        # the same file, the same run: TF32 on float32 inputs (SDPA's flash and cuDNN backends take only
        # 16-bit inputs, so they are left out; the README table shows "n/a" for them)
        run bench_v6.txt $PY -m flashattn.measure.bench v6 baseline sdpa sdpa_efficient \
            --dtype float32 -B 4 -H 12 -D 64 --seq-lens 2048 --json "$OUT/bench_v6.json" --append
        ;;
    repeat)
        rm -f "$OUT/bench_v6_repeat.json" "$OUT/bench_v6_repeat.txt"
        nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
            --format=csv -lms 200 > "$OUT/gpu_clocks.csv" 2>&1 &
        smi=$!
        for i in 1 2 3 4 5; do
            run bench_v6_repeat.txt $PY -m flashattn.measure.bench v6 sdpa_flash sdpa --dtype bfloat16 -B 4 -H 12 -D 64 \
                --seq-lens 2048 --no-check --json "$OUT/bench_v6_repeat.json" --append
            run bench_v6_repeat.txt $PY -m flashattn.measure.bench v6 sdpa_flash sdpa --dtype bfloat16 -B 2 -H 16 -D 128 \
                --seq-lens 8192 --no-check --json "$OUT/bench_v6_repeat.json" --append
        done
        kill $smi 2>/dev/null
        ;;
    profile)
        ncu_version
        run profile.txt $PY -m flashattn.measure.profile all --out "$OUT"
        run profile.txt $PY -m flashattn.measure.profile v6 -B 2 -H 16 -D 128 --seq-len 8192 --out "$OUT"
        ;;
    v7)
        targets bench_v7 v7 v6 sdpa sdpa_flash sdpa_cudnn
        ;;
    v8)
        targets bench_v8 v8 v7 v6 sdpa sdpa_flash sdpa_cudnn
        ;;
    backward)
        targets bench_backward --backward v6 v6_deterministic v8_backward sdpa sdpa_flash sdpa_cudnn fa4
        ;;
    peers)
        # the results chapter's Hopper table: every bf16 forward of ours beside cuDNN, FlashAttention-2 and
        # FlashAttention-4 (a column where flash_attn.cute imports), one interleaved run per configuration
        rm -f "$OUT/bench_peers.json" "$OUT/bench_peers.txt"
        for shape in "4 12 2048 64" "2 16 8192 128" "1 32 4096 128" "16 16 1024 128" "1 8 2048 128"; do
            set -- $shape
            for causal in "" "--causal"; do
                run bench_peers.txt $PY -m flashattn.measure.bench v8 v7 v6 sdpa sdpa_flash sdpa_cudnn fa4 \
                    --dtype bfloat16 -B "$1" -H "$2" --seq-lens "$3" -D "$4" $causal --json "$OUT/bench_peers.json" --append
            done
        done
        rm -f "$OUT/bench_peers_seq.json"
        run bench_peers.txt $PY -m flashattn.measure.bench v8 v7 v6 sdpa sdpa_flash sdpa_cudnn fa4 --dtype bfloat16 \
            -B 4 -H 12 -D 64 --seq-lens 512 1024 2048 4096 8192 --json "$OUT/bench_peers_seq.json"
        ;;
    v8-defaults)
        # the defaults V8 keeps against the sweep's fastest builds (a third stage; B_c = 176 at D=128), in
        # separate processes of --rounds 10 each -> v8_defaults.json, one run per process
        rm -f "$OUT/v8_defaults.json" "$OUT/v8_defaults.txt"
        for i in 1 2 3; do
            rm -rf "$OUT/v8_defaults_$i"
            run v8_defaults.txt $PY -m flashattn.measure.sweep v8 --rounds 10 --out "$OUT/v8_defaults_$i" \
                --jobs "${JOBS:-16}" --only "d64 persistent (default)" "d64 stages3" "d128 persistent (default)" \
                "d128 stages3" "d128 bc176"
            run v8_defaults.txt $PY -c "import sys; from flashattn.measure import results as r; d = r.read(sys.argv[1], 'sweep'); \
r.append(sys.argv[2], 'sweep', d['rows'], d['meta'], d['settings'])" "$OUT/v8_defaults_$i/v8_sweep.json" "$OUT/v8_defaults.json"
        done
        ;;
    backward-repeat)
        rm -f "$OUT/bench_backward_repeat.json" "$OUT/bench_backward_repeat.txt"
        for i in 1 2 3 4 5; do
            run bench_backward_repeat.txt $PY -m flashattn.measure.bench --backward v6 sdpa_flash --dtype bfloat16 -B 4 -H 12 \
                -D 64 --seq-lens 2048 --no-check --json "$OUT/bench_backward_repeat.json" --append
            run bench_backward_repeat.txt $PY -m flashattn.measure.bench --backward v6 sdpa_flash --dtype bfloat16 -B 2 -H 16 \
                -D 128 --seq-lens 8192 --no-check --json "$OUT/bench_backward_repeat.json" --append
        done
        ;;
    backward-dq)
        ncu_version
        rm -f "$OUT/backward_dq.json" "$OUT/backward_dq.txt"
        run backward_dq.txt $PY -m flashattn.book.backward_steps --set dq --json $OUT/backward_dq.json
        run backward_dq.txt $PY -m flashattn.book.backward_steps --set dq --profile $OUT
        ;;
    backward-tile)
        ncu_version
        rm -f "$OUT/backward_tile.json" "$OUT/backward_tile.txt"
        run backward_tile.txt $PY -m flashattn.book.backward_steps --set tile --json $OUT/backward_tile.json
        run backward_tile.txt $PY -m flashattn.book.backward_steps --set tile --profile $OUT
        ;;
    backward-det)
        rm -f "$OUT/backward_det.json" "$OUT/backward_det.txt"
        run backward_det.txt $PY -m flashattn.book.backward_steps --set det --json $OUT/backward_det.json
        ;;
    train)
        rm -f "$OUT/train_demo.json" "$OUT/train_demo.txt"
        run train_demo.txt $PY -m flashattn.book.training --steps 300 --json "$OUT/train_demo.json"
        ;;
    sweep-*)
        v=${step#sweep-}
        rm -f "$OUT/${v}_sweep.json" "$OUT/${v}_sweep.txt"
        run "${v}_sweep.txt" $PY -m flashattn.measure.sweep "$v" --out "$OUT" --jobs "${JOBS:-16}"
        ;;
    profile-new)
        ncu_version
        rm -f "$OUT/profile_new.txt"
        run profile_new.txt $PY -m flashattn.measure.profile v7 --out "$OUT"
        run profile_new.txt $PY -m flashattn.measure.profile v7 -B 2 -H 16 -D 128 --seq-len 8192 --out "$OUT"
        run profile_new.txt $PY -m flashattn.measure.profile v6_backward --out "$OUT"
        ;;
    profile-v8)
        ncu_version
        rm -f "$OUT/profile_v8.txt"
        run profile_v8.txt $PY -m flashattn.measure.profile v8 --out "$OUT"
        run profile_v8.txt $PY -m flashattn.measure.profile v8 -B 2 -H 16 -D 128 --seq-len 8192 --out "$OUT"
        ;;
    figures)
        if $PY -c "import matplotlib, ncu_report" 2>/dev/null && ls "$OUT"/*.ncu-rep >/dev/null 2>&1; then
            run figures.txt $PY -m flashattn.book.plots "$OUT"/*.ncu-rep -o "$OUT/roofline.png"
            for r in "$OUT"/*.ncu-rep; do
                run ncu_tables.md $PY -m flashattn.measure.ncu "$r"
            done
        else
            echo "figures: matplotlib/ncu_report or reports missing; roofline skipped" | tee -a "$OUT/figures.txt"
        fi
        if [ -f "$OUT/bench.json" ]; then
            $PY -m flashattn.measure.table "$OUT/bench.json" > "$OUT/results_table.md" || status=1
        fi
        ;;
    *)
        echo "unknown step $step (bench, v5, v6, repeat, profile, figures, v7, backward, backward-dq, backward-tile, backward-det," \
             "backward-repeat," \
             "train, sweep-VERSION," \
             "profile-new, new, v8, profile-v8, new-v8)" >&2; status=2
        ;;
    esac
done
exit $status
