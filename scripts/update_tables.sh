#!/usr/bin/env bash
# Rewrite every measured number outside the notebooks from the recorded JSON in results/h200: the
# README's tables and the "// Measured on H200" lines of kernels/*.cu. Run after a GPU record.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
R=results/h200
$PY -m flashattn.measure.table $R/bench.json --update-readme README.md
$PY -m flashattn.measure.table $R/bench.json --update-headers "python -m flashattn.measure.bench all --seq-lens 512 1024 2048 4096"
$PY -m flashattn.measure.table $R/bench_v6.json --dtype bfloat16 --head-dim 64 --seq-len 2048 --append \
    --update-headers "python -m flashattn.measure.bench v6 baseline sdpa sdpa_flash sdpa_cudnn sdpa_efficient --dtype bfloat16"
$PY -m flashattn.measure.table $R/bench_v6.json --dtype bfloat16 --head-dim 128 --seq-len 8192 --append \
    --update-headers "python -m flashattn.measure.bench v6 baseline sdpa sdpa_flash sdpa_cudnn sdpa_efficient --dtype bfloat16 -B 2 -H 16 -D 128 --seq-lens 8192"
$PY -m flashattn.measure.table $R/bench_v5.json --compare v5 sdpa v4 --update-readme README.md
$PY -m flashattn.measure.table $R/bench_v6.json --compare v6 sdpa_flash sdpa sdpa_cudnn sdpa_efficient --update-readme README.md
$PY -m flashattn.measure.table $R/bench.json --compare v6 sdpa v5 --block v6-tf32-table --update-readme README.md
$PY -m flashattn.measure.table $R/bench_v6_repeat.json --compare v6 sdpa_flash sdpa --group-shapes --block v6-repeat-table \
    --update-readme README.md
$PY -m flashattn.measure.table --gpu-tests $R/pytest_junit.xml --update-readme README.md
# V7, V8 (Hopper) and the backward pass; a file not recorded yet leaves "Not recorded yet" in its block
$PY -m flashattn.measure.table $R/bench_v7.json --compare v7 v6 sdpa_cudnn sdpa_flash sdpa --tflops --update-readme README.md
$PY -m flashattn.measure.table $R/bench_v8.json --compare v8 sdpa v7 v6 sdpa_flash --tflops --update-readme README.md
$PY -m flashattn.measure.table $R/bench_backward.json --compare v6 v6_deterministic sdpa_flash sdpa_cudnn sdpa --tflops \
    --block backward-table --update-readme README.md
# the "Measured on H200" lines of v7.cu and v8.cu: four each (two shapes, causal and not), the first of
# them replacing the old ones; a record not there yet leaves the file's lines as they are
for v in v7 v8; do
  [ -f "$R/bench_$v.json" ] || { echo "$R/bench_$v.json not recorded yet: kernels/$v.cu headers kept"; continue; }
  case $v in
    v7) CMD="python -m flashattn.measure.bench v7 v6 sdpa sdpa_flash sdpa_cudnn --dtype bfloat16" ;;
    v8) CMD="python -m flashattn.measure.bench v8 v7 v6 sdpa sdpa_flash sdpa_cudnn --dtype bfloat16" ;;
  esac
  append=""
  for shape in "64 2048 -B 4 -H 12" "128 8192 -B 2 -H 16"; do
    read -r D L BH <<< "$shape"
    for causal in "" "--causal"; do
      $PY -m flashattn.measure.table $R/bench_$v.json --dtype bfloat16 --head-dim "$D" --seq-len "$L" $causal --only $v \
          $append --update-headers "$CMD $BH -D $D --seq-lens $L${causal:+ $causal}"
      append=--append
    done
  done
done
