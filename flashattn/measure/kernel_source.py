"""A kernel file as a copier wants it: every build switch at its default, the dead branches gone.

    python -m flashattn.measure.kernel_source v8                 # print it
    python -m flashattn.measure.kernel_source v8 --out v8.cu     # write it

kernels/<version>.cu carries the chapter's steps and sweeps as build switches, each defined as
`#ifndef V8_OVERLAP / #define V8_OVERLAP V8_SPECIALIZE / #endif`, and v8 an instrumented build
(V8_TRACE). The switches' family is the prefixes of those names (V5_, V6_, V6B_, V7_, V8_). This prints
the file with that family resolved as a default build sees it:

* a conditional (`#if`, `#ifdef`, `#ifndef`, `#elif`, `#else`) whose condition names only the family is
  evaluated; its directives and dead branches are dropped;
* the family's object-like definitions go, and where code still uses one its value takes its place;
* a macro of the family that the default build defines as nothing or `((void)0)` (v8's trace stamps)
  goes, and so does every use of it;
* comment lines directly above a dropped branch or definition (a switch's documentation) go with it.

Everything else -- includes, the `__CUDACC__` halves, FLASHATTN_LSE, FLASHATTN_VARLEN, other macros,
comments -- is kept as written. Compiled with the loader's flags, the result has the same machine code as
the file (tests/test_kernel_source.py compares the SASS).

Why no library: unifdef and pcpp resolve conditionals on the macros one names, but neither works out a
switch's default from another switch (V8_SETMAXNREG defaults to V8_SPECIALIZE), puts a switch's value
where code uses it, or drops the uses of a macro that expands to nothing; pcpp also expands every other
macro and include. The part they would do, evaluating a C constant expression, is short here.
"""
from __future__ import annotations

import argparse
import operator
import re
import sys
from pathlib import Path

from flashattn.loader import KERNELS_DIR

_DIRECTIVE = re.compile(r"^\s*#\s*(\w+)\s*(.*)$", re.S)
_DEFINE = re.compile(r"^(\w+)(\([^)]*\))?\s*(.*)$", re.S)
_SWITCH = re.compile(r"^\s*#\s*ifndef\s+(\w+)\s*\n\s*#\s*define\s+\1\b", re.M)
_TOKEN = re.compile(r"\s*(0[xX][0-9a-fA-F]+|\d+|\w+|&&|\|\||==|!=|<=|>=|<<|>>|[-+*/%()!~<>&|^?:])[uUlL]*")
_NOOP_BODIES = ("", "((void)0)")
_FAMILY = re.compile(r"^V\d+[A-Z]?_")
KEEP, DEAD, DIRECTIVE, DEFINE, NOOP_USE = range(5)


def versions() -> list[str]:
    """Every kernel file's name: kernels/<name>.cu."""
    return sorted(p.stem for p in KERNELS_DIR.glob("*.cu"))


def switches(text: str) -> list[str]:
    """The build switches of a kernel file: names defined under `#ifndef NAME`."""
    return list(dict.fromkeys(_SWITCH.findall(text)))


def defaults(text: str) -> dict[str, str]:
    """Each build switch's default as written: {NAME: the text of `#define NAME <default>` under `#ifndef NAME`}."""
    found = re.findall(r"^\s*#\s*ifndef\s+(\w+)\s*\n\s*#\s*define\s+\1\b[ \t]*([^\n]*)", text, re.M)
    return {name: value.split("//")[0].strip() for name, value in found}


def family(text: str) -> tuple[str, ...]:
    """The version's prefixes ("V8_", "V6B_") among the switches: every macro that starts with one is
    resolved. Other switches (FLASHATTN_LSE, which selects the training build; FLASHATTN_VARLEN, the packed
    batches' build) are kept as written."""
    return tuple(sorted({m.group(0) for name in switches(text) if (m := _FAMILY.match(name))}))


# ------------------------------------------------------------------ C constant expressions --------------
class _Expr:
    """A C preprocessor expression over integers: `lookup(name)` gives an identifier's value."""

    _BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="), ("<<", ">>"),
               ("+", "-"), ("*", "/", "%")]
    _OPS = {"||": lambda a, b: a or b, "&&": lambda a, b: a and b, "|": operator.or_, "^": operator.xor,
            "&": operator.and_, "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt,
            "<=": operator.le, ">=": operator.ge, "<<": operator.lshift, ">>": operator.rshift, "+": operator.add,
            "-": operator.sub, "*": operator.mul, "/": lambda a, b: int(a / b), "%": operator.mod}

    def __init__(self, text: str, lookup):
        self.tokens, pos = [], 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise ValueError(f"cannot read {text[pos:]!r}")
            self.tokens.append(m.group(1))
            pos = m.end()
        self.i, self.lookup = 0, lookup

    def value(self) -> int:
        v = self.ternary()
        if self.i != len(self.tokens):
            raise ValueError(f"trailing {' '.join(self.tokens[self.i:])!r}")
        return v

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, tok=None):
        t = self.peek()
        if t is None or (tok is not None and t != tok):
            raise ValueError(f"expected {tok!r}, found {t!r}")
        self.i += 1
        return t

    def ternary(self) -> int:
        cond = self.binary(0)
        if self.peek() != "?":
            return cond
        self.take("?")
        a = self.ternary()
        self.take(":")
        b = self.ternary()
        return a if cond else b

    def binary(self, level: int) -> int:
        if level == len(self._BINARY):
            return self.unary()
        v = self.binary(level + 1)
        while self.peek() in self._BINARY[level]:
            op, w = self.take(), self.binary(level + 1)
            v = int(self._OPS[op](v, w))
        return v

    def unary(self) -> int:
        t = self.take()
        if t == "(":
            v = self.ternary()
            self.take(")")
            return v
        if t in ("!", "-", "~", "+"):
            v = self.unary()
            return {"!": int(not v), "-": -v, "~": ~v, "+": v}[t]
        if t == "defined":
            paren = self.peek() == "("
            if paren:
                self.take("(")
            name = self.take()
            if paren:
                self.take(")")
            return int(self.lookup(name, defined=True))
        if t[0].isdigit():
            return int(t, 0)
        return self.lookup(t)


# ------------------------------------------------------------------ the resolver ----------------------
class _Resolver:
    def __init__(self, prefixes: tuple[str, ...]):
        self.prefixes = prefixes
        self.values: dict[str, str] = {}     # object-like family macros defined so far
        self.noops: set[str] = set()         # family macros that expand to nothing
        self.kept: set[str] = set()          # family macros kept as written (function-like, with a body)

    def ours(self, name: str) -> bool:
        return name.startswith(self.prefixes)

    def names(self, expr: str) -> set[str]:
        return set(re.findall(r"\b[A-Za-z_]\w*\b", expr)) - {"defined"}

    def resolvable(self, expr: str) -> bool:
        names = self.names(expr)
        return bool(names) and all(self.ours(n) for n in names)

    def lookup(self, name: str, defined: bool = False, depth: int = 0) -> int:
        known = name in self.values or name in self.noops or name in self.kept
        if defined:
            return int(known)
        if name not in self.values or depth > 32:
            return 0                         # the preprocessor's value of an undefined name
        return _Expr(self.values[name], lambda n, defined=False: self.lookup(n, defined, depth + 1)).value()

    def evaluate(self, expr: str) -> bool:
        return bool(_Expr(expr, self.lookup).value())

    def value_text(self, name: str) -> str:
        """A switch's value as code may read it: the number, or its text in parentheses."""
        try:
            return str(self.lookup(name))
        except (ValueError, ZeroDivisionError):
            return f"({self.values[name]})"


def _logical_lines(text: str) -> list[str]:
    """Physical lines, a directive's continuation lines (ending in a backslash) joined to it."""
    out: list[str] = []
    for line in text.split("\n"):
        if out and out[-1].lstrip().startswith("#") and out[-1].endswith("\\"):
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def _code_spans(line: str, in_block: bool) -> tuple[list[tuple[int, int]], bool]:
    """(start, end) of the parts of `line` that are code, not comment or string; and whether a block
    comment is still open at its end."""
    spans, i, start, n = [], 0, 0, len(line)
    if in_block:
        end = line.find("*/")
        if end < 0:
            return [], True
        i = start = end + 2
    while i < n:
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            spans.append((start, i))
            end = line.find("*/", i + 2)
            if end < 0:
                return spans, True
            i = start = end + 2
            continue
        if c in "\"'":
            spans.append((start, i))
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            i = start = j + 1
            continue
        i += 1
    spans.append((start, min(i, n)))
    return spans, False


def _drop_call(code: str, name: str) -> str:
    """`code` without every use of macro `name`: `name(...)` with balanced parentheses, or `name`."""
    out, pos = [], 0
    for m in re.finditer(rf"\b{name}\b", code):
        if m.start() < pos:
            continue
        end = m.end()
        rest = code[end:]
        if rest.lstrip().startswith("("):
            depth, j = 0, end + len(rest) - len(rest.lstrip())
            while j < len(code):
                depth += {"(": 1, ")": -1}.get(code[j], 0)
                j += 1
                if depth == 0:
                    break
            end = j
        out.append(code[pos:m.start()].rstrip(" ") if code[pos:m.start()].strip() else code[pos:m.start()])
        pos = end
    out.append(code[pos:])
    return "".join(out)


def _rewrite_code(r: _Resolver, line: str, in_block: bool) -> tuple[str, bool]:
    """A kept line with the family's values put in and its no-op macros dropped (code parts only)."""
    spans, still_open = _code_spans(line, in_block)
    pieces, last = [], 0
    for a, b in spans:
        code = line[a:b]
        for name in sorted(r.noops, key=len, reverse=True):
            code = _drop_call(code, name)
        code = re.sub(r"\b[A-Za-z_]\w*\b",
                      lambda m: r.value_text(m.group(0)) if m.group(0) in r.values else m.group(0), code)
        pieces += [line[last:a], code]
        last = b
    pieces.append(line[last:])
    return "".join(pieces), still_open


def resolve(text: str, prefixes: tuple[str, ...] | None = None) -> str:
    """`text` (a kernel file) with its switch family resolved to the defaults; see the module's doc."""
    prefixes = family(text) if prefixes is None else prefixes
    if not prefixes:
        return text
    r = _Resolver(prefixes)
    lines = _logical_lines(text)
    status = [KEEP] * len(lines)
    out = list(lines)
    stack: list[dict] = []             # per open conditional: resolved, live, taken
    live, in_block = True, False
    for k, line in enumerate(lines):
        m = _DIRECTIVE.match(line) if not in_block else None
        if m and m.group(1) in ("if", "ifdef", "ifndef", "elif", "else", "endif"):
            kind, arg = m.group(1), m.group(2).split("//")[0].strip()
            expr = {"ifdef": f"defined({arg})", "ifndef": f"!defined({arg})"}.get(kind, arg)
            if kind in ("if", "ifdef", "ifndef"):
                resolved = r.resolvable(expr)
                frame = dict(resolved=resolved, parent=live, taken=False)
                stack.append(frame)
                if resolved:
                    frame["taken"] = live = live and r.evaluate(expr)
            else:
                frame = stack[-1]
                if kind == "endif":
                    stack.pop()
                    live = frame["parent"]
                elif frame["resolved"]:
                    hit = frame["parent"] and not frame["taken"] and (kind == "else" or r.evaluate(expr))
                    frame["taken"] |= hit
                    live = hit
            status[k] = DIRECTIVE if frame["resolved"] else KEEP if frame["parent"] else DEAD
            continue
        if not live:
            status[k] = DEAD
            continue
        if m and m.group(1) == "define" and (d := _DEFINE.match(m.group(2))) and r.ours(d.group(1)):
            name, params, body = d.group(1), d.group(2), d.group(3).strip()
            if body.replace(" ", "") in _NOOP_BODIES:
                r.noops.add(name)
            elif params is None:
                r.values[name] = body
            else:
                r.kept.add(name)
                continue
            status[k] = DEFINE
            continue
        new, in_block = _rewrite_code(r, line, in_block)
        if new.strip() in ("", ";") and line.strip() not in ("", ";"):
            status[k] = NOOP_USE
        out[k] = new
    # a comment run directly above a dropped branch or definition (past directives) documents it: it goes
    for k in range(len(lines)):
        if status[k] != KEEP or not lines[k].lstrip().startswith("//"):
            continue
        j = k
        while j < len(lines) and status[j] == KEEP and lines[j].lstrip().startswith("//"):
            j += 1
        while j < len(lines) and status[j] == DIRECTIVE:
            j += 1
        if j < len(lines) and status[j] in (DEAD, DEFINE) and j > k:
            for i in range(k, j):
                if status[i] == KEEP:
                    status[i] = DEAD
    kept = [out[k] for k in range(len(lines)) if status[k] == KEEP]
    result: list[str] = []
    for line in kept:                  # no blank-line runs where something was dropped
        if not (line.strip() == "" and result and result[-1].strip() == ""):
            result.append(line)
    return "\n".join(result)


def kernel_source(version: str) -> str:
    """kernels/<version>.cu as a default build compiles it, with a first line saying where it came from."""
    if version not in versions():
        raise ValueError(f"no kernel file for {version!r} in {KERNELS_DIR} (have: {', '.join(versions())})")
    text = (KERNELS_DIR / f"{version}.cu").read_text()
    if not family(text):
        return text
    return (f"// kernels/{version}.cu with every build switch at its default "
            f"(python -m flashattn.measure.kernel_source {version}).\n" + resolve(text))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.measure.kernel_source",
                                description="Print a kernel file with its build switches resolved to the defaults.")
    p.add_argument("version", help="a kernel file's name: " + ", ".join(versions()))
    p.add_argument("--out", type=Path, help="write it to this file instead of printing it")
    args = p.parse_args(argv)
    try:
        text = kernel_source(args.version)
    except ValueError as e:
        p.error(str(e))
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
