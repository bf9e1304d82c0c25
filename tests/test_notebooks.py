"""The notebooks' own structure: every chapter in the table of contents, stored outputs without errors
or machine-specific text, checked cells with a stored output, included kernel files that exist."""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from flashattn.versions import VERSIONS

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))


def toc_files() -> list[str]:
    toc = (ROOT / "_toc.yml").read_text()
    return re.findall(r"(?:root|file):\s*(\S+)", toc)


def test_every_notebook_is_in_the_toc_and_vice_versa():
    listed = set(toc_files())
    on_disk = {f"book/{p.stem}" for p in BOOK.glob("*.ipynb")} | {f"book/{p.stem}" for p in BOOK.glob("*.md")}
    assert listed == on_disk
    for v in VERSIONS:
        assert f"book/{v}" in listed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_structure(path):
    book = nbformat.read(path, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code and "import flashattn.book.notebook as nb" in code[0].source
    assert book.cells[0].cell_type == "markdown" and book.cells[0].source.startswith("# ")
    for c in code:
        for out in c.get("outputs", []):
            assert out["output_type"] != "error", f"{path.name}: stored error output in {c.source[:60]!r}"
            if out["output_type"] == "stream":
                assert len(out["text"]) < 4000, f"{path.name}: long log in {c.source[:60]!r}"
        if "nbval-check-output" in c.metadata.get("tags", []):
            assert c.get("outputs"), f"{path.name}: checked cell without stored output: {c.source[:60]!r}"
            assert c.get("execution_count") is not None, \
                f"{path.name}: nbval rejects a checked cell with outputs but no count: {c.source[:60]!r}"
            stored = json.dumps(c["outputs"])
            for word in ("/work/", "/home/", "/root/", "µs per call"):   # nothing machine-specific
                assert word not in stored, f"{path.name}: {word!r} in checked output of {c.source[:60]!r}"
    for c in book.cells:
        if c.cell_type == "markdown":
            for inc in re.findall(r"\{literalinclude\}\s+(\S+)", c.source) + re.findall(r":diff:\s+(\S+)", c.source):
                assert (BOOK / inc).resolve().exists(), f"{path.name} includes missing {inc}"


def test_chapters_show_their_kernel_source_from_kernels():
    for v in ("v0", "v1", "v2", "v3", "v4", "v5", "v6"):
        book = nbformat.read(BOOK / f"{v}.ipynb", as_version=4)
        src = "\n".join(c.source for c in book.cells if c.cell_type == "markdown")
        assert f"../kernels/{v}.cu" in src, f"{v}.ipynb does not include kernels/{v}.cu"
