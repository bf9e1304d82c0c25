"""The package's import rules, read from the source with `ast` (nothing is imported):

* layers: book -> measure -> library, never upward (flashattn/*.py imports nothing from flashattn.measure or
  flashattn.book; flashattn/measure/ nothing from flashattn.book);
* no import circle among flashattn modules, counting imports inside functions too;
* flashattn modules are imported at module level, except the few on ALLOWED_LOCAL (heavy or side-effecting);
* any other import inside a function (matplotlib, ncu_report, ...) has a comment saying why;
* no module uses another module's private name (`from x import _y`, `x._y`);
* no module over MAX_LINES lines;
* absolute imports only.

Each rule is a function over {module name: source}, so the last tests can feed it small invented modules
and check that it reports what it must.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "flashattn"
MAX_LINES = 400
LAYERS = {"library": 0, "measure": 1, "book": 2}     # a module may import from its own layer or a lower one

# (importer, imported) -> why the import stays inside a function. Keep it short: every entry must be in use
# (test_allow_list_is_in_use), so a fixed module leaves the list. It is empty because no flashattn module is
# heavy or side-effecting once `flashattn` itself is imported (torch, and the custom ops flashattn/__init__.py
# registers through flashattn.autograd), and Python imports `flashattn` before any `flashattn.x`.
ALLOWED_LOCAL: dict[tuple[str, str], str] = {
}


@dataclass(frozen=True)
class Import:
    importer: str      # dotted module name
    target: str        # the flashattn module it loads (the submodule when `from pkg import submodule`)
    names: tuple       # names taken with `from ... import`
    line: int
    local: bool        # inside a function body
    relative: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_sources() -> dict[str, tuple[str, str]]:
    """{module: (path relative to the repository, source)} for every module of flashattn/."""
    return {module_name(p): (str(p.relative_to(ROOT)), p.read_text())
            for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("measure", "book") else "library"


def is_package(module: str, sources) -> bool:
    path = sources[module][0] if module in sources else ""
    return path.endswith("__init__.py")


def _walk(node, local=False):
    """(node, inside a function) for every node under `node`."""
    for child in ast.iter_child_nodes(node):
        yield child, local
        yield from _walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def imports_of(module: str, sources) -> list[Import]:
    """The imports of flashattn modules in `module` (relative ones resolved), in source order."""
    path, text = sources[module]
    out = []
    for node, local in _walk(ast.parse(text, path)):
        if isinstance(node, ast.Import):
            out += [Import(module, a.name, (), node.lineno, local, False)
                    for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package(module, sources) else module.split(".")[:-1]
                here = here[:len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            if base.split(".")[0] != PACKAGE:
                continue
            names = tuple(a.name for a in node.names)
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in sources]
            rest = tuple(n for n in names if f"{base}.{n}" not in sources)
            out += [Import(module, s, (), node.lineno, local, bool(node.level)) for s in subs]
            if rest or not subs:
                out.append(Import(module, base, rest, node.lineno, local, bool(node.level)))
    return out


def all_imports(sources) -> list[Import]:
    return [i for m in sources for i in imports_of(m, sources)]


def where(i: Import, sources) -> str:
    return f"{sources[i.importer][0]}:{i.line}"


# ---- the rules: each returns one line per violation -------------------------------------------------------

def layer_violations(sources) -> list[str]:
    return [f"{where(i, sources)}: {layer(i.importer)} module {i.importer} imports {i.target} ({layer(i.target)})"
            for i in all_imports(sources) if LAYERS[layer(i.target)] > LAYERS[layer(i.importer)]]


def import_cycles(sources) -> list[str]:
    """Each strongly connected component of the import graph with more than one module (or a module that
    imports itself), with the imports that close it."""
    edges: dict[str, dict[str, Import]] = {m: {} for m in sources}
    for i in all_imports(sources):
        if i.target in edges:
            edges[i.importer].setdefault(i.target, i)
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def connect(v):                  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    out = []
    for c in components:
        if len(c) > 1 or next(iter(c)) in edges[next(iter(c))]:
            links = [f"{where(i, sources)} {a} -> {b}" for a in sorted(c) for b, i in sorted(edges[a].items())
                     if b in c]
            out.append("circle " + " / ".join(sorted(c)) + ": " + "; ".join(links))
    return out


def local_imports(sources, allowed=ALLOWED_LOCAL) -> list[str]:
    return [f"{where(i, sources)}: {i.importer} imports {i.target} inside a function"
            for i in all_imports(sources) if i.local and (i.importer, i.target) not in allowed]


def unexplained_local_imports(sources) -> list[str]:
    """Imports inside a function (of any module: matplotlib, ncu_report, torch.utils.cpp_extension, ...) with no
    comment saying why, on their line or above them (a comment heading the run of imports counts)."""
    out = []
    for module, (path, text) in sources.items():
        lines = text.splitlines()
        for node, local in _walk(ast.parse(text, path)):
            if not (local and isinstance(node, (ast.Import, ast.ImportFrom))):
                continue
            above = node.lineno - 1
            while above > 0 and lines[above - 1].strip().startswith(("import ", "from ")):
                above -= 1
            if "#" not in lines[node.lineno - 1] and not (above > 0 and lines[above - 1].strip().startswith("#")):
                out.append(f"{path}:{node.lineno}: {module}: `{lines[node.lineno - 1].strip()}` inside a function "
                           "without a comment saying why")
    return out


def private_uses(sources) -> list[str]:
    """`from flashattn.x import _y`, and `m._y` where m names a flashattn module (bound by an import, or
    spelled out as flashattn.x)."""
    out = []
    for module, (path, text) in sources.items():
        tree = ast.parse(text, path)
        bound = {}                                  # local name -> the flashattn module it stands for
        for i in imports_of(module, sources):
            if i.target == module:
                continue
            for n in i.names:
                if n.startswith("_") and not n.startswith("__"):
                    out.append(f"{path}:{i.line}: {module} imports {i.target}.{n}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == PACKAGE:     # `import flashattn.x` binds flashattn itself
                        bound[a.asname or PACKAGE] = a.name if a.asname else PACKAGE
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if f"{node.module}.{a.name}" in sources:
                        bound[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            chain, inner = [], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in bound:
                owner = ".".join([bound[inner.id]] + chain[::-1])
                if owner in sources and owner != module:
                    out.append(f"{path}:{node.lineno}: {module} uses {owner}.{node.attr}")
    return out


def long_modules(sources, limit=MAX_LINES) -> list[str]:
    return [f"{path}:{limit + 1}: {module} has {len(text.splitlines())} lines (at most {limit})"
            for module, (path, text) in sources.items() if len(text.splitlines()) > limit]


def relative_imports(sources) -> list[str]:
    return [f"{where(i, sources)}: {i.importer} imports {i.target} relatively" for i in all_imports(sources)
            if i.relative]


# ---- the package obeys them -----------------------------------------------------------------------------

SOURCES = package_sources()


def report(lines: list[str]) -> str:
    return f"{len(lines)} violation(s):\n" + "\n".join(lines)


# one test per rule, so that a report names the rule broken
RULES = {"layers point down": layer_violations, "no import circles": import_cycles,
         "package imports at module level": local_imports, "local imports say why": unexplained_local_imports,
         "no private names across modules": private_uses,
         f"modules at most {MAX_LINES} lines": long_modules, "absolute imports": relative_imports}


@pytest.mark.parametrize("rule", RULES)
def test_package_obeys(rule):
    bad = RULES[rule](SOURCES)
    assert not bad, report(bad)


def test_allow_list_is_in_use():
    used = {(i.importer, i.target) for i in all_imports(SOURCES) if i.local}
    stale = [f"{a} -> {b}" for a, b in ALLOWED_LOCAL if (a, b) not in used]
    assert not stale, "ALLOWED_LOCAL names imports that no longer happen inside a function:\n" + "\n".join(stale)
    assert all(reason.strip() for reason in ALLOWED_LOCAL.values()), "every allowed local import says why"


def test_the_package_is_read():
    assert {"flashattn", "flashattn.loader", "flashattn.measure.bench", "flashattn.book.figures"} <= set(SOURCES)
    assert any(i.target == "flashattn.measure.geometry" for i in all_imports(SOURCES))


# ---- the rules catch what they must ------------------------------------------------------------------------

def fake(**modules: str) -> dict[str, tuple[str, str]]:
    """{module: (path, source)} from keyword arguments like flashattn__book__x="source" (__ is a dot)."""
    out = {}
    for name, text in modules.items():
        dotted = name.replace("__", ".")
        out[dotted] = (dotted.replace(".", "/") + ".py", text)
    for pkg in ("flashattn", "flashattn.measure", "flashattn.book"):
        out.setdefault(pkg, (pkg.replace(".", "/") + "/__init__.py", ""))
    return out


def test_detects_an_upward_import():
    src = fake(flashattn__loader="import os\n\nfrom flashattn.book.x import draw\n",
               flashattn__measure__bench="def f():\n    from flashattn.book import x\n",
               flashattn__book__x="def draw():\n    pass\n")
    bad = layer_violations(src)
    assert len(bad) == 2
    assert bad[0].startswith("flashattn/loader.py:3:") and "flashattn.book.x" in bad[0]
    assert bad[1].startswith("flashattn/measure/bench.py:2:")


def test_allows_a_downward_import():
    src = fake(flashattn__book__x="from flashattn.measure import bench\nimport flashattn.loader\n",
               flashattn__measure__bench="from flashattn import loader\n", flashattn__loader="")
    assert layer_violations(src) == [] and import_cycles(src) == []


def test_detects_a_circle_through_a_function_body():
    src = fake(flashattn__measure__a="from flashattn.measure import b\n",
               flashattn__measure__b="def f():\n    from flashattn.measure.a import g\n    return g\n",
               flashattn__measure__c="import flashattn.measure.a\n")
    (circle,) = import_cycles(src)
    assert "flashattn.measure.a / flashattn.measure.b" in circle and "flashattn/measure/b.py:2" in circle
    assert "measure.c" not in circle.split(":")[0]


def test_detects_a_local_import():
    src = fake(flashattn__book__x="def f():\n    from flashattn.measure import bench\n", flashattn__measure__bench="")
    assert local_imports(src) == ["flashattn/book/x.py:2: flashattn.book.x imports flashattn.measure.bench "
                                  "inside a function"]
    assert local_imports(src, allowed={("flashattn.book.x", "flashattn.measure.bench"): "heavy"}) == []


def test_detects_a_local_import_without_a_reason():
    src = fake(flashattn__book__x="def f():\n    import matplotlib.pyplot as plt\n    return plt\n\n\n"
                                  "def g():\n    # ncu_report exists only where Nsight Compute is installed\n"
                                  "    import csv\n    import ncu_report\n    return ncu_report, csv\n\n\n"
                                  "def h():\n    import selenium  # optional: the browser tests only\n")
    (bad,) = unexplained_local_imports(src)
    assert bad.startswith("flashattn/book/x.py:2:") and "import matplotlib.pyplot as plt" in bad


def test_detects_private_names():
    src = fake(flashattn__book__x="from flashattn.book.y import _helper\n",
               flashattn__book__z="from flashattn.book import y\n\ny._helper()\n",
               flashattn__book__w="import flashattn.book.y\n\nflashattn.book.y._helper()\n",
               flashattn__book__v="import flashattn.book.y as yy\n\nyy._helper()\n",
               flashattn__book__ok="from flashattn.book import y\n\ny.helper()\nself._own = 1\n",
               flashattn__book__y="def _helper():\n    pass\n")
    bad = private_uses(src)
    assert [b.split(":")[0] + ":" + b.split(":")[1] for b in bad] == \
        ["flashattn/book/x.py:1", "flashattn/book/z.py:3", "flashattn/book/w.py:3", "flashattn/book/v.py:3"], bad


def test_detects_a_long_module_and_a_relative_import():
    src = fake(flashattn__book__x="x = 1\n" * (MAX_LINES + 1), flashattn__book__y="from .x import x\n")
    assert long_modules(src) == [f"flashattn/book/x.py:{MAX_LINES + 1}: flashattn.book.x has {MAX_LINES + 1} "
                                 f"lines (at most {MAX_LINES})"]
    assert relative_imports(src) == ["flashattn/book/y.py:1: flashattn.book.y imports flashattn.book.x relatively"]


@pytest.mark.parametrize("module", ["flashattn", "flashattn.book", "flashattn.measure.bench"])
def test_layer_names(module):
    assert layer(module) == {"flashattn": "library", "flashattn.book": "book", "flashattn.measure.bench": "measure"}[
        module]
