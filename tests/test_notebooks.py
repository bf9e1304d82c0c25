"""The notebooks' own structure: every chapter in the table of contents, stored outputs without errors
or machine-specific text, checked cells with a stored output, included kernel files that exist, and imports of
the package that name modules and names it has (read from the source: a moved module fails here, without
running the notebook)."""
from __future__ import annotations

import ast
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


def defined_names(module: str) -> set[str] | None:
    """The top-level names of flashattn module `module` (functions, classes, assignments, imports), or None
    when flashattn has no such module."""
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not path.exists():
        return None
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def package_imports(source: str) -> list[tuple[str, str | None]]:
    """(module, name) for each `import flashattn...` (name None) and `from flashattn... import name` of a code
    cell; IPython's magic and shell lines are left out before parsing."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "flashattn"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "flashattn":
            out += [(node.module, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_imports_name_what_the_package_has(path):
    book = nbformat.read(path, as_version=4)
    missing = []
    for i, c in enumerate(book.cells):
        if c.cell_type != "code":
            continue
        for module, name in package_imports(c.source):
            names = defined_names(module)
            if names is None:
                missing.append(f"cell {i}: no module {module}")
            elif name is not None and name not in names and defined_names(f"{module}.{name}") is None:
                missing.append(f"cell {i}: {module} has no {name}")
    assert not missing, f"{path.name}: " + "; ".join(missing)


def test_import_check_sees_a_moved_module():
    cell = "%matplotlib inline\nimport flashattn.book.notebook as nb\nfrom flashattn.book import figures"
    assert package_imports(cell) == [("flashattn.book.notebook", None), ("flashattn.book", "figures")]
    assert defined_names("flashattn.notebook") is None            # the module's path before the three layers
    assert "show_or_return" in defined_names("flashattn.book.figures")
