"""flashattn.measure.variants: every step and variant of every chapter, defined once."""
from __future__ import annotations

import re

import pytest

from flashattn.measure import kernel_source, variants
from flashattn.measure.variants import SETS, Variant

ALL = [(key, name, v) for key, vs in SETS.items() for name, v in vs.items()]


def macros_tested_in(text: str) -> set[str]:
    """The macros a kernel file lets a build set: the names its preprocessor tests (#ifndef NAME, #if NAME,
    #elif ... NAME, defined(NAME))."""
    lines = re.findall(r"^\s*#\s*(?:ifndef|ifdef|if|elif)\b(.*)$", text, re.M)
    return {name for line in lines for name in re.findall(r"\b[A-Z][A-Z0-9_]*\b", line)}


@pytest.mark.parametrize("key,name,variant", ALL, ids=[f"{k}:{n}" for k, n, _ in ALL])
def test_variant_names_its_kernel_file_and_macros_that_file_tests(key, name, variant):
    assert variant.name == name
    assert variant.path.is_file(), f"{key}:{name}: no kernel file {variant.path}"
    missing = set(variant.macros) - macros_tested_in(variant.path.read_text())
    assert not missing, f"{key}:{name}: kernels/{variant.kernel}.cu tests no macro {sorted(missing)}"
    assert variant.flags == [f"-D{k}={v}" for k, v in variant.macros.items()]


def test_the_macro_reader_reads_the_preprocessor_lines_only():
    text = "#ifndef V9_A\n#define V9_A 1\n#endif\n#if V9_B && defined(V9_C)\n#endif\nint V9_D = V9_A;\n"
    assert macros_tested_in(text) == {"V9_A", "V9_B", "V9_C"}


def test_one_kernel_per_set_and_one_meaning_per_name():
    for key, vs in SETS.items():
        assert len({v.kernel for v in vs.values()}) == 1, key
        assert variants.kernel_of(key) == next(iter(vs.values())).kernel
    seen: dict = {}
    for key, name, v in ALL:   # a name means the same build in every set of its kernel
        first = seen.setdefault((v.kernel, name), v)
        assert first.macros == v.macros, (key, name)
    assert variants.backward("v6_layout2_bulk") is SETS["backward-dq"]["v6_layout2_bulk"]
    with pytest.raises(KeyError):
        variants.backward("no such build")


@pytest.mark.parametrize("key", [k for k in SETS if variants.is_chain(k)])
def test_chains_change_one_thing_per_step_and_end_at_the_committed_file(key):
    """Each step of a chapter's chain is the step before with one switch changed (the pipeline depth counts
    once: it is set for both head dims), and its last step is the file as committed: every macro at the
    value the kernel file defines."""
    text = SETS[key][next(iter(SETS[key]))].path.read_text()
    for D in (64, 128):
        chain = [v for v in SETS[key].values() if v.D == D]
        assert all(v.change for v in chain)
        for before, after in zip(chain, chain[1:]):
            changed = {re.sub(r"_D\d+_", "_D_", k) for k in after.macros if after.macros[k] != before.macros.get(k)}
            assert len(changed) == 1, (before.name, after.name, changed)
        for macro, value in chain[-1].macros.items():
            default = kernel_source.defaults(text).get(macro, "")
            assert default.isdigit() and int(default) == value, (chain[-1].name, macro)


def test_v8_sets_share_the_steps():
    """The v8 sweep times the builds tests/test_v8.py checks: the same macros, at both head dims (bc176 at
    D=128 and d64wg2 at D=64 only)."""
    timed = {n.split(" ", 1)[1].replace("persistent (default)", "default"): v.macros for n, v in SETS["v8"].items()}
    assert timed == {n: v.macros for n, v in SETS["v8-builds"].items()}
    assert {v.D for v in SETS["v8"].values()} == {64, 128}


def test_a_variant_is_plain_data():
    v = Variant("x", "v6", 64, {"V6_D64_STAGES": 3})
    assert v.flags == ["-DV6_D64_STAGES=3"] and v.path.name == "v6.cu" and v.change == ""
