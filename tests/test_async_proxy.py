"""flashattn.book.async_proxy: every fence.proxy.async of kernels/*.cu found by parsing, in the place the figure
says, and each between generic-proxy writes and an async-proxy read behind a barrier."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from flashattn.book import async_proxy  # noqa: E402
from flashattn.loader import KERNELS_DIR  # noqa: E402


def test_every_fence_in_the_kernels_is_found():
    sites = async_proxy.fence_sites()
    texts = [(KERNELS_DIR / f"{n}.cu").read_text() for n in async_proxy.taught()]
    text_count = sum(t.count("fence_proxy_async") - t.count("void fence_proxy_async") for t in texts)
    assert len(sites) == text_count == 2
    assert [(s.file, s.function, s.guard) for s in sites] == [
        ("kernels/v6_backward.cu", "bwd_dkdv_split", "BULK_DQ"), ("kernels/v7.cu", "flash_fwd_wgmma", "!TMA")]


def test_each_fence_sits_after_the_writes_and_before_the_barrier_and_the_async_read():
    backward, v7 = async_proxy.fence_sites()
    # V7's plain loads: this thread's cp.async copies have landed, then fence, then arrive on full[s]
    assert v7.before.startswith("cp_async_wait<") and v7.after == v7.barrier == "mbar_arrive(bar_k(s));"
    assert v7.reader.startswith("Wgmma<BC, T>::ss(") and v7.reader_op == "wgmma.mma_async"
    # the backward's bulk dQ: the stores of dQ_i's image (dq_add), fence, __syncthreads, the bulk reduction
    assert backward.before.startswith("dq_add<") and backward.barrier == "__syncthreads();"
    assert backward.reader_op == "cp.reduce.async.bulk"
    for site in (backward, v7):
        lines = (KERNELS_DIR.parent / site.file).read_text().split("\n")
        assert "fence_proxy_async" in lines[site.line - 1]


def test_a_moved_fence_changes_what_the_parse_reports(tmp_path, monkeypatch):
    text = (KERNELS_DIR / "v7.cu").read_text()
    moved = text.replace("      fence_proxy_async();\n      mbar_arrive(bar_k(s));\n",
                         "      mbar_arrive(bar_k(s));\n      fence_proxy_async();\n")
    assert moved != text
    (tmp_path / "v7.cu").write_text(moved)
    monkeypatch.setattr(async_proxy, "KERNELS_DIR", tmp_path)
    site, = async_proxy.fence_sites(["v7"])
    assert site.before == "mbar_arrive(bar_k(s));"          # what the first test would now reject


def test_async_callers_follow_lambdas_to_the_instruction():
    callers = async_proxy.async_callers((KERNELS_DIR / "v6_backward.cu").read_text())
    assert callers["bulk_reduce_add_f32"] == callers["reduce_dq_tile"] == "cp.reduce.async.bulk"


def test_figure_has_a_panel_per_site_and_the_tma_path():
    assert (KERNELS_DIR.parent / "book" / "_static" / "concepts" / "async_proxy.png").is_file()   # the book's copy
    fig = async_proxy.FIGURES["async_proxy"]()
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles[0].startswith("kernels/v6_backward.cu:") and titles[1].startswith("kernels/v7.cu:")
    assert "kernels/v8.cu has no fence" in titles[2]
    plt.close(fig)
