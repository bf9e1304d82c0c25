#!/usr/bin/env bash
# The README's test command: set up, build the book, lint, run every test. On a machine without a GPU the
# GPU tests skip with a reason; on a GPU machine they run.
#   scripts/test.sh            everything (ruff, pytest, nbval on the notebooks, book build + browser test)
# As root on a Debian/Ubuntu machine it first installs chromium and chromium-driver with apt-get for the
# browser test; elsewhere that test skips and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "warning: could not install chromium; the browser test will skip" >&2
fi
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# No PYTHONPATH: setup.sh installed flashattn into .venv (editable), as a user's own scripts see it.
source .venv/bin/activate
ruff check .
jupyter-book build . -W -q
# two workers (pytest-xdist), a test file each (--dist loadfile: the browser tests share one Chromium):
# most of the time goes to compilers, and one process per core keeps both busy; a notebook's cells share its kernel
JOBS=${JOBS:-2}
BOOK_BUILT=1 python -m pytest -q -n "$JOBS" --dist loadfile tests
python -m pytest -q -n "$JOBS" --dist loadfile --nbval-lax book/
