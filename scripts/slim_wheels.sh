#!/usr/bin/env bash
# The tests' share of the notebook wheels: what tests/ imports beyond the GPU host's own packages (nbformat for
# the notebook tests, IPython for flashattn.book's Markdown) and what those need, about 3 MB of the 30 MB that
# ../shared/gpu-wheels.sh downloads. The GPU calls carry at most 64 MiB with the tree; carry DST (git-ignored)
# and run scripts/gpu_session.sh with WHEELS=DST. ncu_report (16 MB) is left out: gpu_session.sh finds the one
# beside the host's ncu. IPython imports without jedi and parso.
#   scripts/slim_wheels.sh .whl .whl-tests
set -euo pipefail
src=${1:?usage: scripts/slim_wheels.sh SRC DST}; dst=${2:?usage: scripts/slim_wheels.sh SRC DST}
mkdir -p "$dst"
for name in nbformat fastjsonschema jsonschema jsonschema_specifications referencing rpds_py jupyter_core \
            platformdirs traitlets ipython ipython_pygments_lexers stack_data executing \
            asttokens pure_eval prompt_toolkit wcwidth matplotlib_inline pexpect ptyprocess; do
  found=$(ls "$src"/"$name"-[0-9]*.whl 2>/dev/null | head -1 || true)
  if [ -z "$found" ]; then echo "slim_wheels: no $name in $src" >&2; exit 1; fi
  cp "$found" "$dst"/
done
du -sh "$dst"
