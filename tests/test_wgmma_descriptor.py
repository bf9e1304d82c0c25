"""flashattn.book.wgmma_descriptor against kernels/v7.cu itself: the kernel's make_desc, its descriptor
arguments and its cp.async tile offset are cut from the source, compiled for the CPU and compared."""
import random
from pathlib import Path

import matplotlib
import pytest

from flashattn.book import host_cpp
from flashattn.book import wgmma_descriptor as wd

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent


def run_kernel_host(tmp_path, lines: list[str]) -> list[int]:
    """The answers of the kernel's own code (wd.host_program of kernels/v7.cu) to `lines`."""
    if host_cpp.COMPILER is None:
        pytest.skip(host_cpp.MISSING)
    out = host_cpp.run(wd.host_program((ROOT / "kernels" / "v7.cu").read_text()), "\n".join(lines) + "\n",
                       what="kernels/v7.cu's make_desc and tile offsets")
    return [int(x) for x in out.split()]


def test_encode_matches_make_desc(tmp_path):
    rng = random.Random(0)
    cases = [(0, 16, 1024), (16416, 16, 1024), (0x3FFF0, 0x3FFF0, 0x3FFF0), (0x40000, 0x40000, 0x40000)]
    cases += [(rng.randrange(1 << 32), rng.randrange(1 << 32), rng.randrange(1 << 32)) for _ in range(300)]
    cases += [(rng.randrange(0, 232448, 16), 16 * rng.randrange(1 << 14), 16 * rng.randrange(1 << 14))
              for _ in range(300)]
    got = run_kernel_host(tmp_path, [f"d {a} {b} {c}" for a, b, c in cases])
    assert got == [wd.encode(a, b, c) for a, b, c in cases]


def test_decode_inverts_encode():
    for saddr, lbo, sbo in [(0, 16, 1024), (16416, 16384, 1024), (0x3FFF0, 0x3FFF0, 0x3FFF0)]:
        d = wd.decode(wd.encode(saddr, lbo, sbo))
        assert (d["start_address"], d["lbo_bytes"], d["sbo_bytes"], d["swizzle"]) == (saddr, lbo, sbo, "128B")
    assert wd.decode(wd.encode(0, 16, 1024, "64B"))["swizzle"] == "64B"


def test_descriptors_match_the_kernels_arguments(tmp_path):
    cases = [(base, rows, d) for base in (0, 1024, 50176) for rows in (64, 128, 176, 192) for d in (64, 128)]
    lines, want = [], []
    for base, rows, d in cases:
        ours = wd.kernel_descriptors(base, rows, d)
        lines += [f"k {base} {rows} {kk}" for kk in range(d // 16)]
        lines += [f"v {base} {rows} {kk}" for kk in range(rows // 16)]
        want += ours["K"] + ours["V"]
    assert run_kernel_host(tmp_path, lines) == want


def test_element_address_matches_the_kernels_tile_offset(tmp_path):
    cases = [(rows, r, k) for rows, d in ((64, 64), (128, 128), (192, 128)) for r in range(rows) for k in range(d)]
    got = run_kernel_host(tmp_path, [f"o {rows} {r} {k // 8}" for rows, r, k in cases])
    assert [off + 2 * (k % 8) for off, (_, _, k) in zip(got, cases)] == \
        [wd.element_address(r, k, rows)["address"] for rows, r, k in cases]


def test_element_address_steps():
    e = wd.element_address(11, 83, 128)
    assert e["core_matrix"] == (1, 10)
    assert e["descriptor"] == wd.kernel_descriptors(0, 128, 128)["K"][e["panel"] * 4 + e["kk"]]
    assert e["stored_chunk"] == e["chunk"] ^ e["row_in_atom"]
    with pytest.raises(ValueError):
        wd.element_address(0, 0, 128, base=512)


def test_figure_is_deterministic_and_shows_the_computed_address(tmp_path):
    fig = wd.FIGURES["wgmma_descriptor"]()
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(f"= {wd.element_address(11, 83, 128)['address']}" in t for t in texts)
    paths = [tmp_path / f"{i}.png" for i in range(2)]
    for p in paths:
        wd.FIGURES["wgmma_descriptor"]().savefig(p, dpi=50)
    assert paths[0].read_bytes() == paths[1].read_bytes()
