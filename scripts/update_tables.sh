#!/usr/bin/env bash
# Rewrite every measured number outside the notebooks from the recorded JSON in results/h200: the
# README's tables and the "// Measured on H200" lines of kernels/*.cu. Run after a GPU record.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
R=results/h200
$PY -m flashattn.table $R/bench.json --update-readme README.md
$PY -m flashattn.table $R/bench.json --update-headers "python -m flashattn.bench all --seq-lens 512 1024 2048 4096"
$PY -m flashattn.table $R/bench_v6.json --dtype bfloat16 --head-dim 64 --seq-len 2048 --append \
    --update-headers "python -m flashattn.bench v6 baseline sdpa sdpa_flash sdpa_cudnn sdpa_efficient --dtype bfloat16"
$PY -m flashattn.table $R/bench_v6.json --dtype bfloat16 --head-dim 128 --seq-len 8192 --append \
    --update-headers "python -m flashattn.bench v6 baseline sdpa sdpa_flash sdpa_cudnn sdpa_efficient --dtype bfloat16 -B 2 -H 16 -D 128 --seq-lens 8192"
$PY -m flashattn.table $R/bench_v5.json --compare v5 sdpa v4 --update-readme README.md
$PY -m flashattn.table $R/bench_v6.json --compare v6 sdpa_flash sdpa sdpa_cudnn sdpa_efficient --update-readme README.md
$PY -m flashattn.table $R/bench.json --compare v6 sdpa v5 --block v6-tf32-table --update-readme README.md
$PY -m flashattn.table $R/bench_v6_repeat.json --compare v6 sdpa_flash sdpa --group-shapes --block v6-repeat-table \
    --update-readme README.md
$PY -m flashattn.table --gpu-tests $R/pytest_junit.xml --update-readme README.md
