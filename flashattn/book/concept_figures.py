"""The course's concept figures, drawn by package code and kept as PNGs in book/_static/concepts/, so that a
chapter shows them from a markdown cell (a MyST `{figure}`) without running anything.

    python -m flashattn.book.concept_figures           # redraw every figure into book/_static/concepts/
    python -m flashattn.book.concept_figures --check   # compare the committed PNGs with a fresh drawing

Each figure's module checks its worked example against the kernel it depicts (tests/test_<module>.py), and
tests/test_concept_figures.py compares every committed PNG with what the code draws now, so neither the
picture nor the numbers in it can drift from kernels/.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.testing.compare import compare_images

from flashattn.book import (
    async_proxy,
    backward_dataflow,
    decoding_figures,
    mbarrier_ring,
    staircase,
    swizzle_modes,
    warp_specialization,
    wgmma_descriptor,
)
from flashattn.loader import REPO_ROOT

FOLDER = REPO_ROOT / "book" / "_static" / "concepts"
DPI = 110
TOLERANCE = 2.0   # RMS difference of pixel values (0-255) that compare_images still accepts: font hinting
FIGURES = {**wgmma_descriptor.FIGURES, **swizzle_modes.FIGURES, **mbarrier_ring.FIGURES, **async_proxy.FIGURES,
           **warp_specialization.FIGURES, **backward_dataflow.FIGURES, **staircase.FIGURES,
           **decoding_figures.FIGURES}


def save(name: str, folder: Path = FOLDER) -> Path:
    """Draw FIGURES[name] and write it to folder/name.png, as the book shows it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig = FIGURES[name]()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def differences(folder: Path = FOLDER) -> dict[str, str]:
    """name -> what differs, for every figure whose committed PNG is missing or no longer what the code draws."""
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in FIGURES:
            committed = folder / f"{name}.png"
            if not committed.exists():
                found[name] = f"{committed} is missing"
                continue
            try:
                message = compare_images(str(committed), str(save(name, Path(tmp))), tol=TOLERANCE)
            except Exception as err:   # compare_images raises ImageComparisonFailure when the sizes differ
                message = str(err)
            if message:
                found[name] = message
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashattn.book.concept_figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        found = differences()
        for name, message in found.items():
            print(f"{name}: {message}")
        return 1 if found else 0
    for name in FIGURES:
        print(f"wrote {save(name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
