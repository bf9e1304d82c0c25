#!/usr/bin/env bash
# Create .venv (once) and install the flashattn package into it, editable, with its test and book extras
# (requirements.txt -> pyproject.toml). Safe to run again. No GPU is needed: the CUDA build of PyTorch
# installs anywhere, and nvcc compiles the kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# pip's log (including setuptools' notice about editable installs) is shown only when the install fails.
log=$(mktemp)
if ! .venv/bin/python -m pip install -q -r requirements.txt >"$log" 2>&1; then
  cat "$log" >&2; rm -f "$log"; exit 1
fi
rm -f "$log"
# Checked from another directory, so that the import cannot come from the working directory.
(cd / && "$OLDPWD/.venv/bin/python" -c "import torch, ninja, nbval, ncu_report, flashattn
print('torch', torch.__version__, 'CUDA', torch.version.cuda, '| flashattn from', flashattn.__path__[0])")
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "warning: nvcc not found; install the CUDA toolkit to compile the kernels" >&2
fi
