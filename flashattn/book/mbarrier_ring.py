"""The mbarrier protocol of V7's and V8's K/V ring: which slot load t uses and which phase parity each side waits for.

A ring of S slots reuses every slot: load t goes to slot t mod S, and it is the slot's fill number t // S
(0-based). Each slot has a "full" barrier (the copy engine completes a phase when the tile's bytes have
landed) and an "empty" barrier (a phase completes when every consumer warp has let go of the slot). A
barrier's phase bit starts at 0 and flips each time a phase completes; `mbarrier.try_wait.parity p`
returns once the phase of parity p has completed (PTX ISA, "mbarrier.test_wait / mbarrier.try_wait",
https://docs.nvidia.com/cuda/parallel-thread-execution/index.html#parallel-synchronization-and-communication-instructions-mbarrier-test-wait-mbarrier-try-wait).
So the consumer of load t waits on full[t mod S] for parity (t // S) & 1, and the producer, before it
overwrites the slot with load t >= S, waits on empty[t mod S] for the phase that load t - S's release
completed: parity (t // S - 1) & 1. The first S loads find their slots empty and wait for nothing.

`ring_schedule` is that arithmetic; `kernel_rows` runs the kernels' own expressions instead -- the
slot and parity expressions cut out of kernels/v7.cu and kernels/v8.cu by the regular expressions in
`PATTERNS`, compiled into a small host program (flashattn.book.host_cpp) -- so tests/test_mbarrier_ring.py can hold one
against the other. `fig_ring` draws a modelled timeline of both barriers for a 2- and a 3-stage ring
(book/_static/concepts/mbarrier_ring.png is FIGURES["mbarrier_ring"]() saved at dpi=110).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import matplotlib.pyplot as plt

from flashattn.book import host_cpp
from flashattn.book.figures import show_or_return
from flashattn.loader import KERNELS_DIR


@dataclass(frozen=True)
class RingLoad:
    t: int                    # the load's index in the ring (V8, persistent: counted across work items)
    slot: int                 # t mod stages
    full_parity: int          # the consumer waits on full[slot] for this parity
    empty_parity: int | None  # the producer waits on empty[slot] for this parity before the copy; None: no wait
    phases: int               # phases full[slot] has completed once load t has landed


def ring_schedule(stages: int, loads: int) -> list[RingLoad]:
    """The slot and the two parities of loads 0 .. loads - 1 in a ring of `stages` slots."""
    if stages < 1:
        raise ValueError("a ring needs at least one slot")
    return [RingLoad(t, t % stages, (t // stages) & 1, None if t < stages else (t // stages - 1) & 1,
                     t // stages + 1) for t in range(loads)]


def parity_table(stages: int, loads: int) -> str:
    """`ring_schedule` as a markdown table."""
    lines = ["| load t | slot | consumer waits on full[slot] for parity | producer waits on empty[slot] for "
             "parity | phases full[slot] has completed after load t |",
             "|---:|---:|---:|---:|---:|"]
    for r in ring_schedule(stages, loads):
        empty = "none (first fill)" if r.empty_parity is None else str(r.empty_parity)
        lines.append(f"| {r.t} | {r.slot} | {r.full_parity} | {empty} | {r.phases} |")
    return "\n".join(lines)


def check_parity_table(answer, stages: int = 3) -> list[str]:
    """The reader's table, one (slot, full parity, empty parity) per load t = 0, 1, ... (empty parity None,
    "none" or "-" where the producer waits for nothing), held against `ring_schedule`: a sentence per wrong entry, an
    empty list when everything is right."""
    wrong = []
    names = ("slot", "full parity", "empty parity")
    for row, truth in zip(answer, ring_schedule(stages, len(answer))):
        want = (truth.slot, truth.full_parity, truth.empty_parity)
        for name, got, right in zip(names, row, want):
            got = None if got is None or str(got).strip().lower() in ("-", "", "none") else int(got)
            if got != right:
                wrong.append(f"load {truth.t}: {name} is {'none' if right is None else right}, "
                             f"not {'none' if got is None else got}")
    return wrong


# ---------------------------------------------------------------- the kernels' own expressions
# Each pattern cuts one expression out of a kernel file; `kernel_expressions` fails loudly when one stops
# matching, so an edit of the ring code shows up here instead of leaving a stale figure.
PATTERNS = {
    "v7": {
        # the consumer's loop: `const int s = jt % STAGES;` then `const uint32_t parity = (jt / STAGES) & 1;`
        "full": r"const int s = (?P<slot>[^;]+);\s*const uint32_t parity = (?P<parity>[^;]+);",
        # the refill: `mbar_wait(bar_empty(SLOT), PARITY);` followed by `load_kv(LOAD);`
        "empty": r"mbar_wait\(bar_empty\((?P<slot>.+?)\), (?P<parity>.+?)\);\s*load_kv\((?P<load>[^;]+)\);",
        # the slot load_kv writes: `auto load_kv = [&](int t) {   // ...` then `const int s = SLOT;`
        "write": r"auto load_kv = \[&\]\(int t\) \{[^\n]*\n\s*const int s = (?P<slot>[^;]+);",
    },
    "v8": {
        # `auto wait_k = [&](int t) { mbar_wait(full_k(SLOT), PARITY); };`
        "full": r"auto wait_k = \[&\]\(int t\) \{ mbar_wait\(full_k\((?P<slot>.+?)\), (?P<parity>.+?)\); \};",
        # `auto load_k = [&](int t) { const int DECL; if (COND) mbar_wait(empty_k(SLOT), PARITY);`
        "empty": r"auto load_k = \[&\]\(int t\) \{\s*const int (?P<decl>[^;]+);\s*"
                 r"if \((?P<cond>[^)]+)\) mbar_wait\(empty_k\((?P<slot>\w+)\), (?P<parity>.+?)\);",
    },
}


def kernel_expressions(version: str, text: str | None = None) -> dict[str, dict[str, str]]:
    """The slot/parity expressions of kernels/<version>.cu, by `PATTERNS[version]`. Every match of a pattern
    must agree (v7 has the refill twice, for TMA and plain loads); none at all raises."""
    text = (KERNELS_DIR / f"{version}.cu").read_text() if text is None else text
    found = {}
    for name, pattern in PATTERNS[version].items():
        matches = [m.groupdict() for m in re.finditer(pattern, text)]
        if not matches:
            raise ValueError(f"kernels/{version}.cu: the {name!r} pattern no longer matches: {pattern}")
        if any(m != matches[0] for m in matches):
            raise ValueError(f"kernels/{version}.cu: the {name!r} expressions differ between matches: {matches}")
        found[name] = matches[0]
    return found


def _program(version: str, e: dict, loads: int) -> str:
    """A host program printing `full|empty|write STAGES t slot parity` for 2, 3 and 4 stages."""
    if version == "v7":       # the consumer's loop counter is jt; the refill loads tile LOAD at step jt
        body = f"""
  for (int jt = 0; jt < {loads}; ++jt) {{
    const int s = {e['full']['slot']}; const uint32_t parity = {e['full']['parity']};
    std::printf("full %d %d %d %u\\n", STAGES, jt, s, parity);
  }}
  for (int jt = 1; jt < {loads}; ++jt)
    std::printf("empty %d %d %d %u\\n", STAGES, {e['empty']['load']}, (int)({e['empty']['slot']}),
                (uint32_t)({e['empty']['parity']}));
  for (int t = 0; t < {loads}; ++t) {{
    const int s = {e['write']['slot']};
    std::printf("write %d %d %d 0\\n", STAGES, t, s);
  }}"""
    else:                     # ring index kv_base + t; several kv_base, as the persistent loop has
        body = f"""
  for (int kv_base = 0; kv_base < 7; kv_base += 3)
    for (int t = 0; kv_base + t < {loads}; ++t) {{
      std::printf("full %d %d %d %u\\n", STAGES, kv_base + t, (int)({e['full']['slot']}),
                  (uint32_t)({e['full']['parity']}));
      const int {e['empty']['decl']};
      if ({e['empty']['cond']})
        std::printf("empty %d %d %d %u\\n", STAGES, kv_base + t, (int)({e['empty']['slot']}),
                    (uint32_t)({e['empty']['parity']}));
      std::printf("write %d %d %d 0\\n", STAGES, kv_base + t, (int)(s));
    }}"""
    return ("#include <cstdint>\n#include <cstdio>\ntemplate <int STAGES> void ring() {" + body + "\n}\n"
            "int main() { ring<2>(); ring<3>(); ring<4>(); }\n")


def kernel_rows(version: str, loads: int = 24, text: str | None = None) -> dict[int, list[RingLoad]]:
    """What the kernel's own expressions give for loads 0 .. loads - 1 at 2, 3 and 4 stages, compiled
    and run on the host: {stages: rows}. Raises if two evaluations of one load disagree (V8's persistent
    offsets) or if the slot a load writes is not the slot its barriers guard. `text`: the file's text instead
    of kernels/<version>.cu."""
    source = _program(version, kernel_expressions(version, text), loads)
    out = host_cpp.run(source, what=f"kernels/{version}.cu's ring expressions")
    seen: dict[tuple, tuple] = {}
    for line in out.split("\n"):
        if line:
            kind, stages, t, slot, parity = line.split()
            key, value = (kind, int(stages), int(t)), (int(slot), int(parity))
            if seen.setdefault(key, value) != value:
                raise ValueError(f"kernels/{version}.cu: {key} evaluates to {seen[key]} and {value}")
    rows = {}
    for stages in (2, 3, 4):
        rows[stages] = []
        for t in range(loads):
            slot, full = seen[("full", stages, t)]
            if seen[("write", stages, t)][0] != slot:
                raise ValueError(f"kernels/{version}.cu: load {t} writes another slot than the one it waits on")
            empty = seen.get(("empty", stages, t))
            if empty is not None and empty[0] != slot:
                raise ValueError(f"kernels/{version}.cu: load {t} waits on another slot's empty barrier")
            rows[stages].append(RingLoad(t, slot, full, None if empty is None else empty[1], t // stages + 1))
    return rows


# ---------------------------------------------------------------- the figure
def timeline(stages: int, loads: int, copy: float = 1.5, compute: float = 1.0) -> list[dict]:
    """A model of when each load is issued, lands, is used and released: a copy takes `copy`, a tile's use
    `compute` (assumed units, not measurements); load t >= stages is issued when load t - stages is released."""
    events = []
    for r in ring_schedule(stages, loads):
        issue = 0.0 if r.t < stages else events[r.t - stages]["release"]
        land = issue + copy
        start = max(land, events[-1]["release"] if events else 0.0)
        events.append({"row": r, "issue": issue, "land": land, "start": start, "release": start + compute})
    return events


def fig_ring(stages_list=(2, 3), loads: int = 7, show: bool = True):
    """One panel per ring size, one lane per slot: the copy of load t (producer: arrive.expect_tx, then the
    copy engine's complete_tx), its use (consumer: try_wait.parity on full, then arrive on empty), and each
    barrier's phase bit after every flip."""
    fig, axes = plt.subplots(len(stages_list), 1, figsize=(12, 1.9 + 1.55 * sum(stages_list)), sharex=True,
                             gridspec_kw={"height_ratios": list(stages_list)})
    for ax, stages in zip(axes, stages_list):
        events = timeline(stages, loads)
        for e in events:
            r = e["row"]
            y = stages - 1 - r.slot
            if r.empty_parity is not None:      # the producer's wait for the slot to be let go of
                ax.text(e["issue"], y + 0.36, f"wait empty\nparity {r.empty_parity}", ha="center", va="bottom",
                        fontsize=8, color="tab:red")
            ax.barh(y + 0.17, e["land"] - e["issue"], left=e["issue"], height=0.3, color="tab:orange",
                    edgecolor="black", linewidth=0.5)
            ax.text((e["issue"] + e["land"]) / 2, y + 0.17, f"TMA load {r.t}", ha="center", va="center", fontsize=8)
            ax.barh(y - 0.17, e["release"] - e["start"], left=e["start"], height=0.3, color="tab:blue", alpha=0.45,
                    edgecolor="black", linewidth=0.5)
            ax.text((e["start"] + e["release"]) / 2, y - 0.17, f"use {r.t}\n(waited: parity {r.full_parity})",
                    ha="center", va="center", fontsize=7.5)
            # full flips when the bytes land, empty when the last consumer warp arrives
            ax.plot([e["land"]] * 2, [y + 0.02, y + 0.32], color="black", linewidth=2)
            ax.text(e["land"] + 0.03, y + 0.33, f"full\u2192{r.phases & 1}", fontsize=7.5, va="bottom")
            ax.plot([e["release"]] * 2, [y - 0.32, y - 0.02], color="tab:red", linewidth=2)
            ax.text(e["release"] + 0.03, y - 0.34, f"empty\u2192{r.phases & 1}", fontsize=7.5, va="top",
                    color="tab:red")
        ax.set_yticks(range(stages), [f"slot {s}" for s in reversed(range(stages))])
        ax.set_ylim(-0.7, stages - 0.2)
        ax.set_title(f"{stages}-stage ring: load t uses slot t mod {stages}, waits for parity (t // {stages}) & 1",
                     fontsize=10)
    axes[-1].set_xlabel("time in units of one tile's use (a model: a copy assumed to take 1.5 units)")
    fig.text(0.01, 0.005, "orange: the copy, from arrive.expect_tx to complete_tx; blue: the consumers' use; black "
             "tick: full[slot] completes a phase (new phase bit); red tick: empty[slot] completes one",
             fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return show_or_return(fig, show)


FIGURES = {"mbarrier_ring": lambda: fig_ring(show=False)}
