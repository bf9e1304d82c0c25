"""The committed concept figures are what the package draws now, and every one of them is shown in a chapter."""
from __future__ import annotations

import json
from pathlib import Path

from flashattn.book import concept_figures

BOOK = Path(__file__).resolve().parent.parent / "book"


def test_committed_pngs_match_the_code():
    assert concept_figures.differences() == {}, "run python -m flashattn.book.concept_figures and commit"


def test_the_check_catches_a_changed_figure(tmp_path):
    name = next(iter(concept_figures.FIGURES))
    concept_figures.save(name, tmp_path)
    other = next(n for n in concept_figures.FIGURES if n != name)
    (tmp_path / f"{other}.png").write_bytes((tmp_path / f"{name}.png").read_bytes())
    found = concept_figures.differences(tmp_path)
    assert other in found and name not in found


def test_every_figure_is_in_a_chapter_and_every_png_is_a_figure():
    markdown = "".join("".join(c["source"]) for p in BOOK.glob("*.ipynb")
                       for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "markdown")
    for name in concept_figures.FIGURES:
        assert f"_static/concepts/{name}.png" in markdown, f"{name} is shown in no chapter"
    on_disk = {p.stem for p in concept_figures.FOLDER.glob("*.png")}
    assert on_disk == set(concept_figures.FIGURES)
