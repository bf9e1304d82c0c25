"""How long a chapter is to read: words of prose and of output on its main path, and what sits collapsed.

    python -m flashattn.book.words            # every notebook of book/, a row each
    python -m flashattn.book.words --check    # exit 1 when a kernel chapter is over its budget
    python -m flashattn.book.words --reading-table   # the introduction's table of reading times

Prose is the markdown a reader meets on the page; the body of a ``{dropdown}`` is counted apart, as
*collapsed*, because the reader opens it only on purpose (solutions, diffs, asides). Directive options
(``:name:``, ``:alt:``) are not read on the page and are not counted there. The budget is stricter: it
counts every word of every markdown cell (*markdown*: prose, collapsed text, options and all), so that
nothing a chapter holds escapes it by being folded away. Output is the text of every stored
output: streams, plain text, and Markdown or HTML tables with their tags taken out; images count nothing.
"""
from __future__ import annotations

import argparse
import html
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from flashattn.loader import REPO_ROOT

BOOK = REPO_ROOT / "book"
# the main path of a kernel chapter, read in one sitting
PROSE_BUDGET = 3000
OUTPUT_BUDGET = 2000
KERNEL_CHAPTERS = ("v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "backward", "backward_hopper", "decoding")

_PATH_ARGUMENT = {"figure", "image", "literalinclude", "include"}   # their argument is a file, not read
_FENCE = re.compile(r"^(`{3,}|:{3,})\s*\{(\w[\w-]*)\}")


@dataclass
class Count:
    prose: int = 0
    collapsed: int = 0
    output: int = 0
    markdown: int = 0     # every word of the markdown cells: what the budget counts


def count_words(text: str) -> int:
    return len(re.findall(r"\S+", text))


def markdown_words(source: str) -> tuple[int, int]:
    """(words on the page, words inside dropdowns) of one markdown cell."""
    shown = collapsed = 0
    stack: list[tuple[str, bool]] = []           # open fences: (marker, is a dropdown)
    for line in source.splitlines():
        stripped = line.strip()
        opened = _FENCE.match(stripped)
        if opened:
            stack.append((opened.group(1), opened.group(2) == "dropdown"))
            title = "" if opened.group(2) in _PATH_ARGUMENT else stripped[opened.end():]
            if any(d for _, d in stack[:-1]) or stack[-1][1]:
                collapsed += count_words(title)
            else:
                shown += count_words(title)
            continue
        if stack and stripped and set(stripped) <= {"`", ":"} and stripped.startswith(stack[-1][0][:3]) \
                and len(stripped) >= len(stack[-1][0]):
            stack.pop()
            continue
        if stack and re.match(r"^:[\w-]+:", stripped):      # a directive option
            continue
        if any(d for _, d in stack):
            collapsed += count_words(line)
        else:
            shown += count_words(line)
    return shown, collapsed


def output_words(output: dict) -> int:
    if "text" in output:
        return count_words("".join(output["text"]))
    data = output.get("data", {})
    if "text/markdown" in data:
        return count_words("".join(data["text/markdown"]))
    if "text/html" in data:
        return count_words(html.unescape(re.sub(r"<[^>]+>", " ", "".join(data["text/html"]))))
    if any(k.startswith("image/") for k in data):
        return 0
    return count_words("".join(data.get("text/plain", "")))


def count(path: Path) -> Count:
    book = nbformat.read(path, as_version=4)
    c = Count()
    for cell in book.cells:
        if cell.cell_type == "markdown":
            shown, collapsed = markdown_words(cell.source)
            c.prose += shown
            c.collapsed += collapsed
            c.markdown += count_words(cell.source)
        for out in cell.get("outputs", []):
            c.output += output_words(out)
    return c


WORDS_PER_MINUTE = 200
# The introduction's reading-time table: (the row's label, its pages, their lab notes)
READING_ROWS = (
    ("Introduction, online softmax, Measuring", ("intro", "online_softmax", "measuring"), ()),
    ("Baseline, SDPA", ("baseline", "sdpa"), ()),
    ("V0, V1, V2, V3, V4", ("v0", "v1", "v2", "v3", "v4"), ()),
    ("V5, V6", ("v5", "v6"), ("v5_lab", "v6_lab")),
    ("V7, V8", ("v7", "v8"), ("v7_lab", "v8_lab")),
    ("Backward", ("backward",), ("backward_lab",)),
    ("The backward on Hopper", ("backward_hopper",), ("backward_hopper_lab",)),
    ("Attention in real models", ("real_models",), ()),
    ("Decoding", ("decoding",), ("decoding_lab",)),
    ("Results", ("results",), ()),
)


def reading_minutes(name: str) -> int:
    """A page's prose (outside dropdowns) at WORDS_PER_MINUTE, rounded up to five minutes."""
    return 5 * math.ceil(count(BOOK / f"{name}.ipynb").prose / WORDS_PER_MINUTE / 5)


def _minutes(names) -> str:
    m = [reading_minutes(n) for n in names]
    if not m:
        return ""
    return f"{m[0]} min each" if len(m) > 1 and len(set(m)) == 1 else ", ".join(map(str, m)) + " min"


def reading_table() -> str:
    """The introduction's table of reading times (book/intro.ipynb holds it; tests/test_prose_claims.py checks
    that it is this one)."""
    lines = ["| Chapter | Reading time | Its lab notes |", "|---|--:|--:|"]
    lines += [f"| {label} | {_minutes(pages)} | {_minutes(labs)} |".replace("|  |", "| |")
              for label, pages, labs in READING_ROWS]
    return "\n".join(lines)


def over_budget(name: str, c: Count) -> list[str]:
    if name not in KERNEL_CHAPTERS:
        return []
    problems = []
    if c.markdown > PROSE_BUDGET:
        problems.append(f"{name}: {c.markdown} words of markdown (budget {PROSE_BUDGET})")
    if c.output > OUTPUT_BUDGET:
        problems.append(f"{name}: {c.output} words of output (budget {OUTPUT_BUDGET})")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a kernel chapter is over budget")
    parser.add_argument("--reading-table", action="store_true", help="print the introduction's reading times")
    args = parser.parse_args(argv)
    if args.reading_table:
        print(reading_table())
        return 0
    print("| page | prose | collapsed | markdown in all | output |\n|---|--:|--:|--:|--:|")
    problems = []
    for path in sorted(BOOK.glob("*.ipynb")):
        c = count(path)
        print(f"| {path.stem} | {c.prose:,} | {c.collapsed:,} | {c.markdown:,} | {c.output:,} |")
        problems += over_budget(path.stem, c)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
