#!/usr/bin/env bash
# Create .venv (once) and install the project's requirements into it. Safe to run again.
# No GPU is needed: the CUDA build of PyTorch installs anywhere, and nvcc compiles the kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -r requirements.txt 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, ninja, nbval, ncu_report; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "warning: nvcc not found; install the CUDA toolkit to compile the kernels" >&2
fi
