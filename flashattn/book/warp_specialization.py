"""V8's warp-specialized schedule as a timeline: one producer warpgroup, two consumer warpgroups taking turns
on the tensor cores, and the register split setmaxnreg makes between them.

The register numbers are not typed here. `register_split` cuts out of kernels/v8.cu the template arguments
of its `setmaxnreg_dec<...>()` and `setmaxnreg_inc<...>()` calls, the `Registers` struct that computes
them, the block's thread count (`Layout::THREADS`), the build switches (`#ifndef V8_... #define ...`) and
the warpgroup count each head dim is launched with (the `launch<T, D, NWG, ...>` calls of `dispatch_d`),
and compiles them into a host program (flashattn.book.host_cpp) that prints the split. tests/test_warp_specialization.py
holds the result to the PTX rules (a multiple of 8 in 24..256, PTX ISA "setmaxnreg",
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#miscellaneous-instructions-setmaxnreg)
and to the SM's 65,536 registers.

The timeline is a model, like flashattn.book.schedule's (whose `simulate` it draws for the consumers): every
product and softmax takes an assumed time. With the overlap (V8_OVERLAP) a consumer's turn issues
S_{i,j+1} = Q_i K_{j+1}^T and O_i += P_ij V_j together, then runs the softmax of tile j + 1; the producer
issues K_t before V_{t-1}, each once its slot's empty barrier says both consumers have let go of it
(book/_static/concepts/warp_specialization.png is FIGURES["warp_specialization"]() saved at dpi=110).
"""
from __future__ import annotations

import re

import matplotlib.pyplot as plt

from flashattn.book import host_cpp
from flashattn.book.figures import show_or_return
from flashattn.book.schedule import simulate
from flashattn.loader import KERNELS_DIR

REGISTER_FILE = 65536      # 32-bit registers per SM on sm_90 (CUDA C++ Programming Guide, compute capabilities)
PATTERNS = {
    "dec": r"setmaxnreg_dec<(?P<expr>.+?)>\(\);",
    "inc": r"setmaxnreg_inc<(?P<expr>.+?)>\(\);",
    "registers": r"template <int NWG>\s*struct Registers \{.*?\n\};",
    "threads": r"static constexpr int THREADS = (?P<expr>[^;]+);",
    "launch": r"return launch<T, (?P<d>\d+), (?P<nwg>[^,]+),",
    "switch": r"^#ifndef (V8_\w+)\n#define \1\b[^\n]*\n#endif",
}


def _find(name: str, text: str, every: bool = False):
    found = list(re.finditer(PATTERNS[name], text, re.S | re.M))
    if not found:
        raise ValueError(f"kernels/v8.cu: the {name!r} pattern no longer matches: {PATTERNS[name]}")
    return found if every else found[0]


def register_split(text: str | None = None) -> list[dict]:
    """One row per (head dim, causal) launch of kernels/v8.cu at its default switches: consumer warpgroups,
    threads per block, registers per thread at entry and after setmaxnreg for the producer and the consumers."""
    text = (KERNELS_DIR / "v8.cu").read_text() if text is None else text
    dec, inc, threads = (_find(n, text).group("expr") for n in ("dec", "inc", "threads"))
    switches = "\n".join(m.group(0) for m in _find("switch", text, every=True))
    calls = []
    for m in _find("launch", text, every=True):
        for causal in ("false", "true"):
            calls.append(f"  {{ constexpr bool CAUSAL = {causal}; show<{m.group('nwg')}>({m.group('d')}, CAUSAL); }}")
    source = f"""#include <cstdio>
{switches}
{_find("registers", text).group(0)}
template <int NWG> void show(int d, bool causal) {{
  constexpr bool SPECIALIZE = V8_SPECIALIZE != 0;
  std::printf("%d %d %d %d %d %d %d\\n", d, (int)causal, NWG, (int)({threads}), Registers<NWG>::ENTRY,
              (int)({dec}), (int)({inc}));
}}
int main() {{
{chr(10).join(calls)}
}}
"""
    out = host_cpp.run(source, what="kernels/v8.cu's register split")
    keys = ("d", "causal", "consumers", "threads", "entry", "producer", "consumer")
    return [dict(zip(keys, map(int, line.split()))) for line in out.split("\n") if line]


def producer_issues(phases, stages: int = 2, tiles: int = 4) -> list[tuple[str, float, float]]:
    """(name, waited from, issued at) of the producer's copies in the model: K_0 first (Q_i with it), then K_t
    before V_{t-1}; a copy into a used slot waits until every consumer's turn that read the slot has ended
    (K_t is read by the turn of tile t, V_t by that of tile t + 1)."""
    turn_end = {}
    for p in phases:
        if p.kind == "products":
            turn_end[p.tile] = max(turn_end.get(p.tile, 0.0), p.end)
    order = ["K0"] + [x for t in range(1, tiles) for x in (f"K{t}", f"V{t - 1}")] + [f"V{tiles - 1}"]
    issues, clock = [], 0.0
    for name in order:
        t = int(name[1:])
        free = 0.0 if t < stages else turn_end[t - stages + (0 if name[0] == "K" else 1)]
        issued = max(clock, free)
        issues.append((name, clock, issued))
        clock = issued + 0.08          # one thread issues the copies one after the other
    return issues


def fig_schedule(tiles: int = 4, show: bool = True):
    """Lanes: the producer warpgroup (its copies, and its waits on the empty barriers), the two consumer
    warpgroups (their turn on the tensor cores, then the softmax) and the tensor cores, over `tiles` key
    tiles, with each lane's registers per thread from setmaxnreg at D=128."""
    split = {(r["d"], r["causal"]): r for r in register_split()}
    r = split[(128, 0)]
    phases = simulate(warpgroups=2, tiles=tiles, pingpong=True)
    colors = ["#1f77b4", "#ff7f0e"]
    fig, ax = plt.subplots(figsize=(12, 4.6))
    for p in phases:
        y = 2 - p.warpgroup
        if p.kind == "products":
            label = "S0" if p.tile == 0 else f"S{p.tile} + PV{p.tile - 1}"
            ax.barh(y, p.end - p.start, left=p.start, color=colors[p.warpgroup], edgecolor="black", linewidth=0.5)
            ax.barh(0, p.end - p.start, left=p.start, height=0.5, color=colors[p.warpgroup], edgecolor="black",
                    linewidth=0.5)
            ax.text((p.start + p.end) / 2, 0, f"WG {p.warpgroup + 1}", ha="center", va="center", fontsize=8)
        else:
            label = f"softmax {p.tile}"
            ax.barh(y, p.end - p.start, left=p.start, color=colors[p.warpgroup], alpha=0.3, edgecolor="black",
                    linewidth=0.5)
        ax.text((p.start + p.end) / 2, y, label, ha="center", va="center", fontsize=8.5)
    groups: list[list] = []            # copies issued back to back share one label
    for name, waited, issued in producer_issues(phases, tiles=tiles):
        if issued - waited > 0.1:      # the producer thread sat on an empty barrier
            ax.barh(3, issued - waited, left=waited, height=0.3, color="white", edgecolor="tab:red", hatch="///",
                    linewidth=0.6)
        ax.plot([issued], [3], marker="v", color="black")
        if groups and issued - groups[-1][1] < 0.3:
            groups[-1][0].append(name)
        else:
            groups.append([[name], issued])
    for names, issued in groups:
        ax.text(issued, 3.22, ", ".join(names), ha="left", va="bottom", fontsize=8.5)
    ax.set_yticks([3, 2, 1, 0], [f"producer WG 0: TMA\nsetmaxnreg.dec {r['producer']}",
                                 f"consumer WG 1\nsetmaxnreg.inc {r['consumer']}",
                                 f"consumer WG 2\nsetmaxnreg.inc {r['consumer']}", "tensor cores"])
    ax.set_ylim(-0.5, 3.7)
    after = 128 * (r["producer"] + r["consumers"] * r["consumer"])
    ax.set_title(f"D=128, registers per thread from kernels/v8.cu: {r['entry']} at entry ({r['threads']} threads x "
                 f"{r['entry']} = {r['threads'] * r['entry']:,}); after setmaxnreg 128 x ({r['producer']} + "
                 f"{r['consumers']} x {r['consumer']}) = {after:,} of the SM's {REGISTER_FILE:,}", fontsize=10)
    ax.set_xlabel("time in units of one turn's products (assumed: a softmax takes as long; a model, not a "
                  "measurement)\nturns pass by named barriers (ping-pong); hatched: the producer waits on an empty "
                  "barrier; the last tile's PV is not drawn")
    fig.tight_layout()
    return show_or_return(fig, show)


FIGURES = {"warp_specialization": lambda: fig_schedule(show=False)}
