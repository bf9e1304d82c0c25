"""Execute the book's notebooks in place (outputs stored), the way they are committed.

    python scripts/execute_notebooks.py book [COPY_DIR]

Runs each notebook with its own directory as the working directory, one after another, and writes the
executed notebook back (and a copy to COPY_DIR when given). Uses nbclient, so no nbconvert is needed.
"""
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main(folder: str, copy_dir: str | None = None) -> int:
    failed = 0
    for path in sorted(Path(folder).glob("*.ipynb")):
        start = time.time()
        nb = nbformat.read(path, as_version=4)
        try:
            NotebookClient(nb, timeout=900, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
            status = "ok"
        except Exception as exc:  # keep going: report every notebook that fails
            status, failed = f"FAILED: {str(exc).splitlines()[-1][:300] if str(exc) else exc!r}", failed + 1
        nbformat.write(nb, path)
        if copy_dir:
            Path(copy_dir).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(copy_dir) / path.name)
        print(f"{path.name}: {status} ({time.time() - start:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
