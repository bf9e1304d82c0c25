"""The V7 chapter reads its steps from the sweep record by variant name: each row of its step table
(flashattn.book.v7_notes.STEPS) names two variants of flashattn.measure.variants.SETS["v7"] that differ in one
choice. These tests keep the chapter and the sweep in step without a GPU: every name exists at the right
head dim, every variant of the sweep appears in some step, and the two variants of a step differ in
exactly one macro of kernels/v7.cu (a B_c step also raises __launch_bounds__' blocks per SM, V7_D*_MINB,
which is what lets its smaller tile run two blocks per SM; a TMA step at fixed occupancy also moves the
controls that hold the blocks per SM, V7_D*_MINB and V7_SMEM_PAD, and the record must show the same blocks per
SM on both sides)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashattn.book.v7_notes import STEPS
from flashattn.measure import geometry
from flashattn.measure.variants import SETS

ROOT = Path(__file__).resolve().parent.parent


def macros_of(name: str) -> dict[str, int]:
    """Every tile macro of kernels/v7.cu at the variant's head dim: the file's default unless the variant
    sets it."""
    variant = SETS["v7"][name]
    names = ["V7_TMA", "V7_STAGES", "V7_SMEM_PAD"] + [f"V7_D{variant.D}_{k}" for k in ("WG", "BC", "MINB")]
    return {n: variant.macros.get(n, geometry.constant("v7", n)) for n in names}




def test_steps_name_sweep_variants_at_their_head_dim():
    assert STEPS, "the chapter's step table is empty"
    for D, before, after, _ in STEPS:
        for name in (before, after):
            assert name in SETS["v7"], f"step variant {name!r} is not in flashattn.measure.variants.SETS['v7']"
            assert SETS["v7"][name].D == D, f"{name!r} is a D={SETS['v7'][name].D} variant, step says {D}"


def test_every_sweep_variant_is_in_a_step():
    used = {n for _, before, after, _ in STEPS for n in (before, after)}
    assert set(SETS["v7"]) <= used, f"variants the chapter never compares: {set(SETS['v7']) - used}"


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s[3])
def test_each_step_changes_one_choice(step):
    D, before, after, _ = step
    a, b = macros_of(before), macros_of(after)
    changed = {k for k in a if a[k] != b[k]}
    if f"V7_D{D}_BC" in changed:
        assert changed == {f"V7_D{D}_BC", f"V7_D{D}_MINB"}, f"{before} -> {after} changes {sorted(changed)}"
    elif "V7_TMA" in changed and len(changed) > 1:
        assert changed - {"V7_TMA"} <= {f"V7_D{D}_MINB", "V7_SMEM_PAD"}, f"{before} -> {after}: {sorted(changed)}"
        record = {r["name"]: r for r in json.loads((ROOT / "results/h200/v7_sweep.json").read_text())["rows"]}
        blocks = {n: record[n]["occupancy"]["blocks_per_sm"] for n in (before, after)}
        assert blocks[before] == blocks[after], f"{before} -> {after} is no fixed-occupancy control: {blocks}"
    else:
        assert len(changed) == 1, f"{before} -> {after} changes {sorted(changed) or 'nothing'}"


def _code_cells(name: str = "v7") -> list[str]:
    book = json.loads((ROOT / "book" / f"{name}.ipynb").read_text())
    return ["".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code"]


def test_chapter_builds_and_disassembles_through_the_package():
    """The build cell is the shared one (live.build, then the printed load_inline call), and the machine
    code of the lab notes comes from flashattn.measure.sass through flashattn.book.v7_notes: no load_inline
    call, cuobjdump lookup or SASS regex of the chapter's own, on either page."""
    code = _code_cells()
    build = next(i for i, s in enumerate(code) if 'live.build("v7")' in s)
    assert 'loader.load_inline_call("v7")' in code[build + 1]
    joined = "\n".join(code + _code_cells("v7_lab"))
    for own in ("load_inline(", "cuobjdump", "CUOBJDUMP", "--dump-sass", "Function : "):
        assert own not in joined, f"book/v7.ipynb or v7_lab.ipynb still has its own {own!r}"
    assert "v7_notes.sass_table(" in joined and "v7_notes.s_product_listing(" in joined
    notes = (ROOT / "flashattn" / "book" / "v7_notes.py").read_text()
    assert 'sass.disassemble("v7")' in notes and "hot_loop()" in notes
