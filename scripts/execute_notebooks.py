"""Execute the book's notebooks in place (outputs stored), the way they are committed.

    python scripts/execute_notebooks.py book [COPY_DIR]                 # every notebook of a folder
    python scripts/execute_notebooks.py book/v7.ipynb book/backward.ipynb --copy DIR

Runs each notebook with its own directory as the working directory, one after another (they share one
GPU, and each one times kernels), and writes the executed notebook back (and a copy to DIR when given).
Prints one line per notebook; the exit status is 1 when any failed. Uses nbclient, so no nbconvert is
needed.
"""
import argparse
import shutil
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def notebooks(paths: list[str]) -> list[Path]:
    """The notebooks named, a folder standing for every notebook in it (sorted)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(p.glob("*.ipynb"))
        elif p.suffix == ".ipynb" and p.exists():
            out.append(p)
        else:
            raise SystemExit(f"not a notebook or a folder of notebooks: {p}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="notebooks or folders; a trailing folder that holds no "
                                                 "notebook is the copy folder (older form)")
    parser.add_argument("--copy", help="also copy each executed notebook into this folder")
    args = parser.parse_args(argv)
    paths, copy_dir = args.paths, args.copy
    if len(paths) == 2 and Path(paths[0]).is_dir() and not list(Path(paths[1]).glob("*.ipynb")):
        paths, copy_dir = paths[:1], copy_dir or paths[1]    # `book COPY_DIR`
    failed = 0
    for path in notebooks(paths):
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
    sys.exit(main())
