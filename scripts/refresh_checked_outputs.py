"""Refresh the stored outputs of the deterministic cells of executed notebooks, keep everything else.

    python scripts/refresh_checked_outputs.py book/results.ipynb [...]

Cells tagged `nbval-check-output` (nbval's cell-metadata tag) only read committed files (recorded
results, compiler reports) and print the same thing on any machine. When such a file changes after the
notebooks were executed on the GPU machine (say, metadata added to a results JSON), this re-executes the
notebook here, copies the new outputs of those cells only, and leaves every live output (timings,
correctness runs) as the GPU run produced it.
"""
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

TAG = "nbval-check-output"   # nbval checks the outputs of cells carrying this tag, even under --nbval-lax


def refresh(path: Path) -> int:
    stored = nbformat.read(path, as_version=4)
    fresh = nbformat.read(path, as_version=4)
    NotebookClient(fresh, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    changed = 0
    for old, new in zip(stored.cells, fresh.cells):
        if not (old.cell_type == "code" and TAG in old.metadata.get("tags", [])):
            continue
        unrun = old.execution_count is None      # a new cell: nbval treats a cell without a count as unrun
        if old.outputs != new.outputs or unrun:
            old.outputs = new.outputs
            old.execution_count = new.execution_count if unrun else old.execution_count
            changed += 1
    nbformat.write(stored, path)
    return changed


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {refresh(Path(arg))} checked cell(s) refreshed")
