"""flashattn.book.warp_specialization: the register split parsed from kernels/v8.cu and the schedule's figure."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashattn.book import host_cpp, schedule, warp_specialization  # noqa: E402
from flashattn.loader import KERNELS_DIR  # noqa: E402
from flashattn.versions import INFO  # noqa: E402

pytestmark = pytest.mark.skipif(host_cpp.COMPILER is None, reason=host_cpp.MISSING)


def test_register_split_obeys_setmaxnreg_and_fits_the_register_file():
    rows = warp_specialization.register_split()
    # every head dim v8 takes, masked and not (flashattn.versions is what the Python side refuses by)
    assert {(r["d"], r["causal"]) for r in rows} == {(d, c) for d in INFO["v8"].head_dims for c in (0, 1)}
    for r in rows:
        for regs in (r["producer"], r["consumer"]):
            assert regs % 8 == 0 and 24 <= regs <= 256, r
        assert r["threads"] == 128 * (r["consumers"] + 1)
        assert r["producer"] < r["entry"] < r["consumer"]
        assert 128 * (r["producer"] + r["consumers"] * r["consumer"]) <= r["threads"] * r["entry"]
        assert r["threads"] * r["entry"] <= warp_specialization.REGISTER_FILE


def test_split_follows_the_kernel_text():
    text = (KERNELS_DIR / "v8.cu").read_text()
    changed = text.replace("PRODUCER = NWG == 2 ? 24 : 32;", "PRODUCER = NWG == 2 ? 40 : 32;")
    assert changed != text
    d128 = [r for r in warp_specialization.register_split(changed) if r["d"] == 128]
    assert {r["producer"] for r in d128} == {40}
    with pytest.raises(ValueError, match="no longer matches"):
        warp_specialization.register_split(text.replace("setmaxnreg_dec<", "setmaxnreg_decrease<"))


def test_producer_waits_for_both_consumers_before_refilling():
    phases = schedule.simulate(warpgroups=2, tiles=4, pingpong=True)
    issues = {name: issued for name, _, issued in warp_specialization.producer_issues(phases, stages=2, tiles=4)}
    s0_done = max(p.end for p in phases if p.kind == "products" and p.tile == 0)
    assert issues["K2"] >= s0_done and issues["K0"] == 0.0 and issues["K1"] < issues["V0"] < issues["K2"]


def test_figure_labels_come_from_the_split():
    d128 = next(r for r in warp_specialization.register_split() if r["d"] == 128)
    assert (KERNELS_DIR.parent / "book" / "_static" / "concepts" / "warp_specialization.png").is_file()
    fig = warp_specialization.FIGURES["warp_specialization"]()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert f"setmaxnreg.dec {d128['producer']}" in labels[0] and f"setmaxnreg.inc {d128['consumer']}" in labels[2]
    plt.close(fig)
