"""Figures kept as PNGs beside the book: drawn by package code, written once, and compared with a fresh drawing
so that a committed picture cannot drift from the code that draws it. flashattn.book.concept_figures and
flashattn.book.ring_figures each hold a FIGURES table ({name: function returning a matplotlib figure}) and a
folder, and hand them to these three functions.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.testing.compare import compare_images

DPI = 110
TOLERANCE = 2.0   # RMS difference of pixel values (0-255) that compare_images still accepts: font hinting


def save(figures: dict, name: str, folder: Path) -> Path:
    """Draw figures[name] and write it to folder/name.png, as the book shows it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig = figures[name]()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def differences(figures: dict, folder: Path) -> dict[str, str]:
    """name -> what differs, for every figure whose committed PNG is missing or no longer what the code draws."""
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in figures:
            committed = folder / f"{name}.png"
            if not committed.exists():
                found[name] = f"{committed} is missing"
                continue
            try:
                message = compare_images(str(committed), str(save(figures, name, Path(tmp))), tol=TOLERANCE)
            except Exception as err:   # compare_images raises ImageComparisonFailure when the sizes differ
                message = str(err)
            if message:
                found[name] = message
    return found


def main(prog: str, doc: str, figures: dict, folder: Path, argv=None) -> int:
    """The command line of a figures module: redraw every figure, or --check them (exit 1 on a difference)."""
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    if parser.parse_args(argv).check:
        found = differences(figures, folder)
        for name, message in found.items():
            print(f"{name}: {message}")
        return 1 if found else 0
    for name in figures:
        print(f"wrote {save(figures, name, folder)}")
    return 0
