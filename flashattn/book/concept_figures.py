"""The course's concept figures, drawn by package code and kept as PNGs in book/_static/concepts/, so that a
chapter shows them from a markdown cell (a MyST `{figure}`) without running anything.

    python -m flashattn.book.concept_figures           # redraw every figure into book/_static/concepts/
    python -m flashattn.book.concept_figures --check   # compare the committed PNGs with a fresh drawing

Each figure's module checks its worked example against the kernel it depicts (tests/test_<module>.py), and
tests/test_concept_figures.py compares every committed PNG with what the code draws now, so neither the
picture nor the numbers in it can drift from kernels/.
"""
from __future__ import annotations

from pathlib import Path

from flashattn.book import (
    async_proxy,
    backward_dataflow,
    decoding_figures,
    figure_files,
    mbarrier_ring,
    real_models,
    staircase,
    swizzle_modes,
    warp_specialization,
    wgmma_descriptor,
)
from flashattn.loader import REPO_ROOT

FOLDER = REPO_ROOT / "book" / "_static" / "concepts"
FIGURES = {**wgmma_descriptor.FIGURES, **swizzle_modes.FIGURES, **mbarrier_ring.FIGURES, **async_proxy.FIGURES,
           **warp_specialization.FIGURES, **backward_dataflow.FIGURES, **staircase.FIGURES,
           **decoding_figures.FIGURES, **real_models.FIGURES}


def save(name: str, folder: Path = FOLDER) -> Path:
    """Draw FIGURES[name] and write it to folder/name.png, as the book shows it."""
    return figure_files.save(FIGURES, name, folder)


def differences(folder: Path = FOLDER) -> dict[str, str]:
    """name -> what differs, for every figure whose committed PNG is missing or no longer what the code draws."""
    return figure_files.differences(FIGURES, folder)


def main(argv=None) -> int:
    return figure_files.main("python -m flashattn.book.concept_figures", __doc__, FIGURES, FOLDER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
