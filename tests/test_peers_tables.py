"""The results chapter's comparison with FlashAttention-4, cuDNN and FlashAttention-2, read from the committed
records: every shape's row, ratios that are the record's own, the ranges the prose reads, and the method line."""
from __future__ import annotations

import pytest

from flashattn.book import peers_tables
from flashattn.book.records import bench_rows


def _rows(path):
    out = {}
    for r in bench_rows(path):
        out.setdefault((r["batch_size"], r["num_heads"], r["seq_len_q"], r["head_dim"], bool(r["causal"])),
                       {})[r["version"]] = r
    return out


@pytest.mark.parametrize("table, path, ours, peer", [
    (peers_tables.forward_table, peers_tables.PEERS, "v8", "fa4"),
    (peers_tables.sequence_table, peers_tables.PEERS_SEQ, "v8", "sdpa_cudnn"),
    (peers_tables.backward_table, peers_tables.BACKWARD, "v6", "sdpa_flash")])
def test_every_shape_has_its_row_and_its_ratio(table, path, ours, peer):
    text = table().data
    name = peers_tables.NAMES[peer]
    assert f"{peers_tables.NAMES[ours]} vs {name}" in text.splitlines()[0]
    for (B, H, L, D, causal), got in _rows(path).items():
        mine, theirs = got[ours]["median_us"], got[peer]["median_us"]
        row = next(line for line in text.splitlines()
                   if line.startswith(f"| {B}, {H}, {L}, {D} |") and f"| {'yes' if causal else 'no'} |" in line)
        assert f"| {mine:,.1f} |" in row and f"| {theirs / mine:.2f}× |" in row
    assert "host slack" in text or "held" in text


def test_summary_is_the_range_of_the_records_ratios():
    got = peers_tables.summary()
    ratios = [s["fa4"]["median_us"] / s["v8"]["median_us"] for s in _rows(peers_tables.PEERS).values()]
    assert got["fa4"] == (pytest.approx(min(ratios)), pytest.approx(max(ratios)))
    assert f"V8 against FA4: {min(ratios):.2f}× to {max(ratios):.2f}×" in peers_tables.summary_lines()


def test_a_missing_record_says_so(tmp_path):
    assert "Not recorded yet" in peers_tables.forward_table(tmp_path / "none.json").data
