#!/usr/bin/env bash
# What travels to the GPU machine is the working tree (tracked and untracked-not-ignored files, plus the
# paths a call carries), 64 MiB at most. The committed Nsight Compute reports are about 32 MiB of it and
# only the notebooks read them, so the calls that stage FlashAttention-4 or run benchmarks can leave them
# here and carry a 40 MiB part instead (fa4/1, fa4/2: `PART=40M ../shared/fa4-wheels.sh fa4`).
#   scripts/device_tree.sh light   delete the tracked *.ncu-rep files from the working tree (git keeps them)
#   scripts/device_tree.sh full    restore them from git (do this before unpacking a call's records.tar.gz,
#                                  which may hold newly recorded reports)
#   scripts/device_tree.sh keep GLOB...  like light, but keep the reports whose paths match a GLOB (the whole
#                                  set is over 64 MiB since the V8B_BR80 profiles: a call that executes
#                                  notebooks keeps the reports those notebooks read, e.g. 'results/h200/flash_v8_*')
#   scripts/device_tree.sh size    the MiB that would travel, without any carried path
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:?usage: scripts/device_tree.sh light|keep GLOB...|full|size} in
  light) git ls-files -z '*.ncu-rep' | xargs -0 rm -f ;;
  keep)
    shift
    git ls-files -z '*.ncu-rep' | while IFS= read -r -d '' f; do
      for g in "$@"; do case $f in $g) continue 2 ;; esac; done
      rm -f "$f"
    done ;;
  full)  git ls-files -z --deleted '*.ncu-rep' | xargs -0 -r git checkout -- ;;
  size)  ;;
  *) echo "usage: scripts/device_tree.sh light|keep GLOB...|full|size" >&2; exit 2 ;;
esac
set +o pipefail   # stat fails on the files `light` deleted: they do not travel
{ git ls-files -z --cached; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null |
  awk '{s += $1} END {printf "%.1f MiB would travel\n", s / 1048576}'
