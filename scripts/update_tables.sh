#!/usr/bin/env bash
# Rewrite the README's measured tables from the recorded JSON in results/h200 (the kernels carry no
# numbers: their headers point at these records). Run after a GPU record.
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's environment (scripts/setup.sh makes .venv); PYTHON overrides it
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
R=results/h200
$PY -m flashattn.measure.table $R/bench.json --update-readme README.md
$PY -m flashattn.measure.table $R/bench_v5.json --compare v5 sdpa v4 --update-readme README.md
$PY -m flashattn.measure.table $R/bench_v6.json --compare v6 sdpa_flash sdpa sdpa_cudnn sdpa_efficient --update-readme README.md
$PY -m flashattn.measure.table $R/bench.json --compare v6 sdpa v5 --block v6-tf32-table --update-readme README.md
$PY -m flashattn.measure.table $R/bench_v6_repeat.json --compare v6 sdpa_flash sdpa --group-shapes --block v6-repeat-table \
    --update-readme README.md
$PY -m flashattn.measure.table --gpu-tests $R/pytest_junit.xml --update-readme README.md
# V7, V8 (Hopper) and the backward pass; a file not recorded yet leaves "Not recorded yet" in its block
$PY -m flashattn.measure.table $R/bench_v7.json --compare v7 v6 sdpa_cudnn sdpa_flash sdpa --tflops --update-readme README.md
$PY -m flashattn.measure.table $R/bench_v8.json --compare v8 sdpa v7 v6 sdpa_flash --tflops --update-readme README.md
$PY -m flashattn.measure.table $R/bench_peers.json --compare v8 fa4 sdpa_cudnn sdpa_flash v7 v6 --tflops \
    --block peers-table --update-readme README.md
$PY -m flashattn.measure.table $R/bench_backward.json --compare v8_backward v8_backward_deterministic v6 fa4 sdpa_cudnn sdpa_flash --tflops \
    --block backward-table --update-readme README.md
$PY -m flashattn.measure.decode_bench --out $R --update-readme README.md
