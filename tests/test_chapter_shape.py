"""What every kernel chapter's main path holds: at most its word budget, its build cell (the load_inline call
written out), and exercises with their solutions collapsed; its deep evidence on a lab-notes page beside it."""
from __future__ import annotations

import re

import nbformat
import pytest

from flashattn.book import words

BOOK = words.BOOK
# the chapter -> the kernel file its build cell writes out
BUILDS = {"v0": "v0", "v1": "v1", "v2": "v2", "v3": "v3", "v4": "v4", "v5": "v5", "v6": "v6", "v7": "v7",
          "v8": "v8", "backward": "v6_backward", "backward_hopper": "v8_backward", "decoding": "decode"}
LAB_PAGES = ("v5", "v6", "v7", "v8", "backward", "backward_hopper", "decoding")


@pytest.mark.parametrize("chapter", words.KERNEL_CHAPTERS)
def test_main_path_is_within_budget(chapter):
    assert words.over_budget(chapter, words.count(BOOK / f"{chapter}.ipynb")) == []


@pytest.mark.parametrize("chapter", words.KERNEL_CHAPTERS)
def test_chapter_writes_out_its_load_inline_call(chapter):
    book = nbformat.read(BOOK / f"{chapter}.ipynb", as_version=4)
    calls = [c for c in book.cells if c.cell_type == "code" and f'load_inline_call("{BUILDS[chapter]}")' in c.source]
    assert calls, f"{chapter}.ipynb has no cell printing loader.load_inline_call({BUILDS[chapter]!r})"
    assert any("load_inline(" in "".join(o.get("text", "")) for c in calls for o in c.get("outputs", [])), \
        f"{chapter}.ipynb: the build cell has no stored load_inline call"


@pytest.mark.parametrize("chapter", words.KERNEL_CHAPTERS)
def test_chapter_closes_with_exercises_and_collapsed_solutions(chapter):
    book = nbformat.read(BOOK / f"{chapter}.ipynb", as_version=4)
    text = "\n".join(c.source for c in book.cells if c.cell_type == "markdown")
    assert "## Exercises" in text
    assert len(re.findall(r"\{dropdown\}\s*Solution", text)) >= 2


@pytest.mark.parametrize("chapter", LAB_PAGES)
def test_lab_notes_page_is_linked_both_ways(chapter):
    main = nbformat.read(BOOK / f"{chapter}.ipynb", as_version=4)
    lab = nbformat.read(BOOK / f"{chapter}_lab.ipynb", as_version=4)
    assert any(f"{chapter}_lab.ipynb" in c.source for c in main.cells if c.cell_type == "markdown")
    assert any(f"{chapter}.ipynb" in c.source for c in lab.cells if c.cell_type == "markdown")


def test_the_counter_sees_prose_dropdowns_and_outputs():
    shown, collapsed = words.markdown_words("One two three.\n\n:::{dropdown} Solution four\nfive six\n:::\n"
                                            "```{figure} x.png\n:name: fig-x\n:alt: not read on the page\n"
                                            "seven eight\n```\nnine")
    assert (shown, collapsed) == (3 + 2 + 1, 2 + 2)
    assert words.output_words({"output_type": "display_data",
                               "data": {"text/html": "<table><tr><td>a b</td></tr></table>"}}) == 2
    assert words.over_budget("v6", words.Count(markdown=words.PROSE_BUDGET + 1)) != []
    assert words.over_budget("v6", words.Count(prose=10, markdown=words.PROSE_BUDGET)) == []
    assert words.over_budget("intro", words.Count(markdown=10 ** 6)) == []
