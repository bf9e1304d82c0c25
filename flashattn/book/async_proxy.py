"""The two proxies of shared memory and where `fence.proxy.async.shared::cta` goes, read from the kernels.

Threads reach shared memory through the generic proxy (st.shared, ld.shared, the non-bulk cp.async);
TMA copies (cp.async.bulk.tensor, cp.reduce.async.bulk) and wgmma's reads of its shared-memory operands go
through the async proxy. The memory model orders accesses of one proxy only: bytes written through the
generic proxy are not guaranteed visible to an async-proxy read of the same address until the writing
thread executes a proxy fence, and a barrier then tells the reader that every writer has fenced (PTX ISA,
Memory Consistency Model, "Proxies",
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#proxies, and the `fence.proxy.async`
variants of "membar / fence",
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-membar).
A TMA load feeding wgmma needs no such fence: both sides are async proxy, and the mbarrier's complete_tx
orders them.

`fence_sites` finds every use of the fence in kernels/*.cu by parsing the source: the wrapper functions
whose asm holds `fence.proxy.async`, each call of one, the function and `if constexpr` branch around it,
the statements just before and after it, the barrier that publishes the writes, and the first async-proxy
reader that follows (a function or lambda that reaches cp.async.bulk, cp.reduce.async.bulk or
wgmma.mma_async; not a lambda the fence sits in, whose next call runs the code before the fence again).
`fig_proxies` draws one lane pair per site from those fields, so a fence that moves changes the figure
(book/_static/concepts/async_proxy.png is FIGURES["async_proxy"]() saved at dpi=110).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from flashattn.book.figures import show_or_return
from flashattn.loader import KERNELS_DIR
from flashattn.versions import KERNEL_VERSIONS

FENCE = "fence.proxy.async"
ASYNC_OPS = ("cp.async.bulk", "cp.reduce.async.bulk", "wgmma.mma_async")
BARRIERS = re.compile(r"\b(mbar_arrive|mbar_wait|__syncthreads|named_bar_sync|named_bar_arrive)\s*\(")
_FUNCTION = re.compile(r"(?:__global__|__device__)[^;{]*?\b(?!__launch_bounds__)(\w+)\s*\([^;{]*\)\s*(?:const\s*)?\{")
_LAMBDA = re.compile(r"\bauto\s+(\w+)\s*=\s*\[[^\]]*\]\s*\([^)]*\)\s*\{")
_GUARD = re.compile(r"\bif constexpr \((.+)\)\s*(?:\{|\w)")


@dataclass(frozen=True)
class FenceSite:
    file: str            # kernels/<name>.cu
    line: int            # 1-based line of the fence (the wrapper's call)
    function: str        # the kernel or device function around it
    guard: str | None    # the `if constexpr` condition it sits under, if any
    before: str          # the statement just before
    after: str           # the statement just after
    barrier: str         # the first barrier call after it (what publishes the fenced writes)
    reader: str          # the first call after it that reaches the async proxy
    reader_op: str       # the PTX instruction that call reaches


def _block_end(text: str, open_brace: int) -> int:
    depth = 0
    for i in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError("unbalanced braces")


def _code(line: str) -> str:
    return line.split("//")[0].strip()


def _bodies(text: str, pattern: re.Pattern) -> list[tuple[str, int, int]]:
    """(name, start, end) of every function or lambda body that `pattern` opens (the match ends at its brace)."""
    return [(m.group(1), m.start(), _block_end(text, m.end() - 1)) for m in pattern.finditer(text)]


def async_callers(text: str) -> dict[str, str]:
    """{name: PTX instruction} of every function and lambda of `text` that reaches the async proxy, directly in
    its asm or through another such name."""
    bodies = _bodies(text, _FUNCTION) + _bodies(text, _LAMBDA)
    found = {}
    for name, start, end in bodies:
        body = text[start:end]
        for op in ASYNC_OPS:
            if op in body and "asm" in body:
                found[name] = op
    changed = True
    while changed:                       # lambdas and functions calling those, until nothing is added
        changed = False
        for name, start, end in bodies:
            if name in found:
                continue
            for callee, op in list(found.items()):
                if re.search(rf"\b{callee}\s*[<(]", text[text.index("{", start) + 1:end]):
                    found[name], changed = op, True
                    break
    return found


def _statement(lines: list[str], i: int, step: int) -> str:
    """The whole statement whose last line (step -1) or first line (step +1) is the nearest code line from i."""
    j = i + step
    while 0 <= j < len(lines) and (not _code(lines[j]) or _code(lines[j]).startswith("#")):
        j += step
    if step > 0:
        parts = [_code(lines[j])]
        while not parts[-1].endswith((";", "{", "}")):
            j += 1
            parts.append(_code(lines[j]))
        return " ".join(parts)
    parts = [_code(lines[j])]
    while j > 0 and _code(lines[j - 1]) and not _code(lines[j - 1]).endswith((";", "{", "}", "else")):
        j -= 1
        parts.insert(0, _code(lines[j]))
    return " ".join(parts)


def taught() -> list[str]:
    """The kernel files whose fences this page draws: every version's, V6's backward and decode's.
    The page predates kernels/v8_backward.cu, whose fences (its dS^T tile and dQ image in shared memory, the
    deterministic mode's turns on the global proxy) it does not draw: its parser finds no reader for them."""
    names = set(KERNEL_VERSIONS) | {"v6_backward", "decode"}
    return sorted(n for n in names if (KERNELS_DIR / f"{n}.cu").is_file())


def fence_sites(names=None) -> list[FenceSite]:
    """Every call of a `fence.proxy.async` wrapper in the taught kernel files (or in the files `names`), in
    file order."""
    sites = []
    for path in [KERNELS_DIR / f"{n}.cu" for n in (taught() if names is None else names)]:
        text = path.read_text()
        functions = _bodies(text, _FUNCTION)
        wrappers = {name for name, start, end in functions if FENCE in text[start:end]}
        readers = async_callers(text)
        lines = text.split("\n")
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line) + 1)
        for i, line in enumerate(lines):
            code = _code(line)
            called = [w for w in wrappers if re.search(rf"\b{w}\s*\(\s*\)\s*;", code)]
            if not called or any(s <= offsets[i] <= e and n in wrappers for n, s, e in functions):
                continue
            name, start, end = [f for f in functions if f[1] <= offsets[i] <= f[2]][-1]
            guard = _GUARD.search(code)
            if guard is None:            # the block the call sits in: walk back to its opening brace
                depth = 0
                for j in range(i - 1, -1, -1):
                    c = _code(lines[j])
                    depth += c.count("}") - c.count("{")
                    if depth < 0:
                        guard = _GUARD.search(c)
                        break
            after = range(i + 1, text.count("\n", 0, end) + 1)
            barrier = next(_code(lines[j]) for j in after if BARRIERS.search(_code(lines[j])))
            inside = {n for n, s, e in _bodies(text, _LAMBDA) if s <= offsets[i] <= e}
            reader = next((j, r) for j in after for r in readers
                          if r not in inside and re.search(rf"\b{r}\s*[<(]", _code(lines[j])))
            sites.append(FenceSite(f"kernels/{path.name}", i + 1, name, guard.group(1) if guard else None,
                                   _statement(lines, i, -1), _statement(lines, i, +1), barrier,
                                   _code(lines[reader[0]]), readers[reader[1]]))
    return sites


def _short(statement: str, width: int = 46) -> str:
    """A statement cut to `width` characters for a box label."""
    s = re.sub(r"^(?:else|if constexpr \([^)]*\)|if \([^)]*\))\s*", "", statement)
    if len(s) <= width:
        return s
    call = re.match(r"([A-Za-z_]\w*)(<)?", s)
    return call.group(1) + ("<...>" if call.group(2) else "") + "(...)" if call else s[:width - 3] + "..."


def _box(ax, x, y, w, text, color):
    ax.add_patch(FancyBboxPatch((x, y - 0.28), w, 0.56, boxstyle="round,pad=0.02", facecolor=color,
                                edgecolor="black", linewidth=0.6))
    ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=8.5, family="monospace")


def fig_proxies(show: bool = True):
    """One panel per fence site, plus the TMA path that needs none: the generic proxy's writes on the upper
    lane, the async proxy's read on the lower, and the fence (red) between them, annotated from the source."""
    sites = fence_sites()
    fig, axes = plt.subplots(len(sites) + 1, 1, figsize=(12, 2.5 * (len(sites) + 1)))
    for ax, site in zip(axes, sites):
        where = f"{site.file}:{site.line}, in {site.function}" + (f", under if constexpr ({site.guard})"
                                                                    if site.guard else "")
        ax.set_title(where, fontsize=10, loc="left")
        _box(ax, 0.0, 1, 3.3, "before: " + _short(site.before, 34), "#cfe2f3")
        ax.axvline(3.55, color="tab:red", linewidth=3)
        ax.text(3.55, 1.62, f"line {site.line}: fence.proxy.async.shared::cta", color="tab:red", ha="center",
                fontsize=9, family="monospace", bbox={"facecolor": "white", "edgecolor": "none"})
        _box(ax, 3.8, 1, 2.7, "publish: " + _short(site.barrier, 26), "#eeeeee")
        _box(ax, 6.8, 0, 4.2, "async read: " + _short(site.reader, 30) + f"\n-> {site.reader_op}", "#fce5cd")
        ax.annotate("", xy=(6.8, 0.1), xytext=(6.5, 0.9), arrowprops={"arrowstyle": "->"})
    ax = axes[-1]
    no_fence = [f"{n}.cu" for n in taught()
                if "wgmma.mma_async" in (t := (KERNELS_DIR / f"{n}.cu").read_text()) and FENCE not in t]
    ax.set_title("the TMA path (" + ", ".join(f"kernels/{n}" for n in no_fence) + " has no fence; V7 with TMA "
                 "neither): both sides are async proxy", fontsize=10, loc="left")
    _box(ax, 0.0, 0, 3.3, "TMA: cp.async.bulk.tensor\n(complete_tx on full[s])", "#fce5cd")
    _box(ax, 3.8, 1, 2.7, "wait: mbar_wait(full[s], parity)", "#eeeeee")
    _box(ax, 6.8, 0, 4.2, "wgmma reads K_j, V_j\n-> wgmma.mma_async", "#fce5cd")
    ax.annotate("", xy=(3.8, 0.9), xytext=(3.3, 0.1), arrowprops={"arrowstyle": "->"})
    ax.annotate("", xy=(6.8, 0.1), xytext=(6.5, 0.9), arrowprops={"arrowstyle": "->"})
    for ax in axes:
        ax.set_xlim(-0.2, 11.2)
        ax.set_ylim(-0.6, 1.9)
        ax.set_yticks([0, 1], ["async proxy\n(TMA, wgmma)", "generic proxy\n(threads)"])
        ax.set_xticks([])
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return show_or_return(fig, show)


FIGURES = {"async_proxy": lambda: fig_proxies(show=False)}
