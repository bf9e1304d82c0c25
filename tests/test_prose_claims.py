"""Numbers that prose quotes from a record, recomputed from the record.

A sentence such as "FlashAttention-4 takes 0.86 to 0.96 of its time" is typed next to the file it comes from;
when the file is recorded again, the sentence must change with it (an audit found ten that had not). Each
claim names the text and builds the sentence it must contain from the record; line breaks and the `//` of a
C++ comment read as spaces."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from flashattn.book import words
from flashattn.book.training_data import read_source
from flashattn.measure import results, table

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def record(name: str) -> dict:
    """results/h200/NAME, read once per test session."""
    return results.read(results.H200 / name)


def bench_range(name: str, numerator: str, denominator: str) -> str:
    """numerator's time over denominator's across a bench record's shapes, "0.86 to 0.96"."""
    return table.ratio_range(record(name), numerator, denominator)


def median(name: str, **where) -> float:
    """The median_us of the one row of a prefill or varlen record that matches `where`."""
    rows = [r for r in record(name)["rows"] if all(r.get(k) == v for k, v in where.items())]
    assert len(rows) == 1, f"{name}: {len(rows)} rows match {where}"
    return rows[0]["median_us"]


def wide_d96(part: str, column: str, causal: bool) -> float:
    return median("prefill_wide.json", part=part, column=column, B=1, H_q=32, N=4096, D=96, causal=causal)


def prefill_d128(column: str) -> float:
    return median("prefill_forward.json", part="forward", column=column, B=1, H_q=32, H_kv=32, N=4096, D=128,
                  causal=True)


def fa4_backward_d96() -> str:
    r = sorted(wide_d96("backward", "fa4", c) / wide_d96("backward", "v8", c) for c in (False, True))
    return f"FlashAttention-4 took {r[0]:.2f} to {r[1]:.2f} of our time"


def varlen_backward() -> str:
    t = {c: median("varlen.json", part="varlen_backward", column=c) for c in ("ours", "ours_per_sequence", "fa4")}
    return (f"it took {t['ours']:,.0f} µs against {t['ours_per_sequence']:,.0f} µs for this kernel run once per "
            f"sequence and {t['fa4']:,.0f} µs for FlashAttention-4's varlen backward")


def padded_d96_exercise() -> str:
    v8, fa4 = wide_d96("forward", "v8", True), wide_d96("forward", "fa4", True)
    v8_128, fa4_128 = prefill_d128("v8"), prefill_d128("fa4")
    return (f"V8 at 96 takes {v8:.1f} µs against {v8_128:.1f} µs at 128, about {100 * (1 - v8 / v8_128):.0f}% "
            f"less, while FlashAttention-4, which computes 96 as it is, takes {fa4:.1f} µs against {fa4_128:.1f} "
            f"µs, about {100 * (1 - fa4 / fa4_128):.0f}% less")


# (the text, a function that builds from the record the sentence it must contain)
CLAIMS = [
    ("README.md", lambda: f"takes {bench_range('bench_backward.json', 'v8_backward', 'v6')} of V6's backward's time"),
    ("README.md",
     lambda: f"FlashAttention-4 takes {bench_range('bench_backward.json', 'fa4', 'v8_backward')} of its time"),
    ("book/next.md",
     lambda: f"takes {bench_range('bench_backward.json', 'v8_backward', 'fa4')} times FlashAttention-4's time"),
    ("kernels/v8_backward.cu", fa4_backward_d96),
    ("kernels/v8_backward.cu", varlen_backward),
    ("book/real_models.ipynb", padded_d96_exercise),
]


def _flat(path: Path) -> str:
    """The prose of a notebook (its markdown cells) or of a text file, on one line."""
    return _one_line(re.sub(r"\n\s*//", "\n", read_source(path)))


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("text,sentence", CLAIMS, ids=[f"{t}:{i}" for i, (t, _) in enumerate(CLAIMS)])
def test_prose_number_matches_its_record(text, sentence):
    expected = sentence()
    assert expected in _flat(ROOT / text), f"{text} should say '{expected}', as its record now gives"


def test_introduction_reading_times_are_the_pages_word_counts():
    """book/intro.ipynb's table of reading times is flashattn.book.words.reading_table() of today's pages
    (`python -m flashattn.book.words --reading-table` prints it)."""
    assert _one_line(words.reading_table()) in _flat(ROOT / "book" / "intro.ipynb")
    assert words.reading_minutes("v8_lab") == 5 * -(-words.count(words.BOOK / "v8_lab.ipynb").prose // 1000)


def test_ratio_range_reads_each_shape_within_its_run():
    def row(version, us, shape=(1, 2, 64, 64)):
        B, H, L, D = shape
        return dict(version=version, median_us=us, status="ok", batch_size=B, num_heads=H, seq_len_q=L,
                    head_dim=D, dtype="bfloat16", causal=False)
    doc = results.several("bench", [
        results.document("bench", [row("a", 10.0), row("b", 20.0), row("a", 5.0, (2, 2, 64, 64))]),
        results.document("bench", [row("a", 30.0), row("b", 40.0), row("b", 1.0, (2, 2, 64, 64))]),
    ])
    assert table.time_ratios(doc, "a", "b") == [0.5, 0.75]   # a shape's lone rows pair with nothing across runs
    assert table.ratio_range(doc, "a", "b") == "0.50 to 0.75"
    with pytest.raises(ValueError, match="no shape has both a and c"):
        table.ratio_range(doc, "a", "c")
