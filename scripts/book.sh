#!/usr/bin/env bash
# The README's main command: set up and build the book (no GPU needed; the notebooks are committed with
# the outputs of a run on an H200 and are not executed by the build). Output: _build/html/index.html
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/jupyter-book build . -W
echo "open _build/html/index.html"
