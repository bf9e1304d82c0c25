"""Refresh the stored outputs of the deterministic cells of executed notebooks, keep everything else.

    python scripts/refresh_checked_outputs.py book/results.ipynb [...]
    python scripts/refresh_checked_outputs.py --figures "figures.roofline(" book/v7.ipynb [...]

Cells tagged `nbval-check-output` (nbval's cell-metadata tag) only read committed files (recorded
results, compiler reports) and print the same thing on any machine. When such a file changes after the
notebooks were executed on the GPU machine (say, metadata added to a results JSON), this re-executes the
notebook here, copies the new outputs of those cells only, and leaves every live output (timings,
correctness runs) as the GPU run produced it. `--figures TEXT` also copies the outputs of the cells whose
source contains TEXT: figures drawn from recorded files only (a roofline from the Nsight Compute reports),
which nbval cannot compare and so are not tagged, after the code that draws them changed.
"""
import fcntl
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

TAG = "nbval-check-output"   # nbval checks the outputs of cells carrying this tag, even under --nbval-lax


FIGURES: list[str] = []   # --figures: sources of record-only figure cells to refresh as well


def refresh(path: Path) -> int:
    fresh = nbformat.read(path, as_version=4)
    NotebookClient(fresh, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    # the notebook is read again, under a lock, just before it is written, so that edits made to it while it
    # ran (by another process that takes the same lock) are kept; cells are matched by their id
    with open(Path(tempfile.gettempdir()) / "flashattn-notebooks.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _copy_checked_outputs(path, {c.id: c for c in fresh.cells})


def _copy_checked_outputs(path: Path, fresh: dict) -> int:
    stored = nbformat.read(path, as_version=4)
    changed = 0
    for old in stored.cells:
        new = fresh.get(old.id)
        if new is None:
            continue
        figure = any(text in old.source for text in FIGURES)
        if not (old.cell_type == "code" and (TAG in old.metadata.get("tags", []) or figure)):
            continue
        unrun = old.execution_count is None      # a new cell: nbval treats a cell without a count as unrun
        if old.outputs != new.outputs or unrun:
            old.outputs = new.outputs
            old.execution_count = new.execution_count if unrun else old.execution_count
            changed += 1
    nbformat.write(stored, path)
    return changed


if __name__ == "__main__":
    args = sys.argv[1:]
    while args and args[0] == "--figures":
        FIGURES.append(args[1])
        args = args[2:]
    for arg in args:
        print(f"{arg}: {refresh(Path(arg))} checked cell(s) refreshed")
