"""The pages `ncu --import REPORT --page details|raw|source --csv` prints, read back (no ncu_report needed).

- details and raw pages: what flashattn.measure.profile saves next to each report, and what tests/test_ncu.py
  compares flashattn.measure.ncu's parsed values with; the raw page of a run with many launches (a sweep's
  `--metrics`, the backward's steps) holds one row per launch.
- the source page, per SASS instruction, with its warp-stall samples: split per kernel, cut to the columns the
  book reads, and searched for the memory instruction a long-scoreboard stall waits on (register_waits).
"""
from __future__ import annotations

import csv
import re

from flashattn.measure.ncu import STALL, parse_number, unit_scale


def read_details_csv(path) -> dict[str, tuple[str, str]]:
    """`ncu --import R --page details --csv --print-units base`: label -> (printed value, unit), first
    kernel, first occurrence of each label."""
    out = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(skip_preamble(fh)):
            label = row.get("Metric Name")
            if label and label not in out:
                out[label] = (row.get("Metric Value", ""), row.get("Metric Unit", ""))
    return out


def raw_values(raw: dict[str, tuple[str, str]], names: dict[str, str]) -> tuple[dict, dict]:
    """From a raw page (read_raw_csv): ({key: value in base units or None} for names {key: metric},
    {stall reason: cycles per issued instruction}, largest first)."""
    def value(name):
        text, unit = raw.get(name, ("", ""))
        x = parse_number(text)
        return None if x is None else x * unit_scale(unit)
    found = {k: value(m) for k, m in names.items()}
    stall = {m.group(1): value(n) for n in raw if (m := STALL.match(n))}
    return found, dict(sorted(((k, v) for k, v in stall.items() if v), key=lambda kv: -kv[1]))


def read_raw_csv(path) -> dict[str, tuple[str, str]]:
    """`ncu --import R --page raw --csv --print-units base`: metric -> (printed value, unit), first kernel.
    The file has a header row of metric names, a row of units, then one row per kernel."""
    return read_raw_rows(path)[0]


def read_raw_rows(path) -> list[dict[str, tuple[str, str]]]:
    """Every kernel of a raw page (see read_raw_csv), in the report's order."""
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(skip_preamble(fh)) if r]
    names, units = rows[0], rows[1]
    return [{n: (v, u) for n, u, v in zip(names, units, values)} for values in rows[2:] if len(values) == len(names)]


def skip_preamble(fh):
    """ncu may print '==PROF==' or warning lines before the CSV; start at the first quoted line."""
    lines = fh.read().splitlines()
    first = next((i for i, l in enumerate(lines) if l.startswith('"')), 0)
    return lines[first:]


# ------------------------------------------------------------------ the source page, per SASS instruction
# `ncu --import R --page source --csv --print-source sass` of a report with the SourceCounters section: per
# kernel a line `"Kernel Name","<name>"`, then a CSV table with one row per SASS instruction (Address,
# Source, warp stall samples in all and per reason: stall_long_sb, stall_wait, ...).
SOURCE_COLUMNS = ("Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_short_sb",
                  "stall_wait", "stall_math", "stall_mio", "stall_barrier", "stall_lg")


def split_source_page(text: str) -> dict[str, list[dict[str, str]]]:
    """The source page of several kernels -> {kernel name: its rows, as dicts keyed by column}."""
    pages, name, block = {}, None, []

    def close():
        if name is not None and block:
            rows = list(csv.reader(block))
            pages[name] = [dict(zip(rows[0], r)) for r in rows[1:] if len(r) == len(rows[0])]

    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            close()
            name, block = next(csv.reader([line]))[1], []
        elif name is not None and line.strip():
            block.append(line)
    close()
    return pages


def write_source_rows(pages: dict[str, list[dict]], path, labels=None, columns=SOURCE_COLUMNS) -> None:
    """The columns of `columns` of every kernel's rows, one CSV with the kernel first: its label from
    `labels` (in the page's order) or its full name (the whole page is megabytes; these are what the book
    reads)."""
    names = list(labels) if labels is not None else list(pages)
    if len(names) != len(pages):
        raise ValueError(f"{len(names)} labels for {len(pages)} kernels")
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(("Kernel Name", *columns))
        for name, rows in zip(names, pages.values()):
            out.writerows((name, *(r.get(c, "") for c in columns)) for r in rows)


def read_source_rows(path) -> dict[str, list[dict[str, str]]]:
    """write_source_rows' file back: {kernel name: rows}, in the file's order."""
    pages: dict[str, list[dict[str, str]]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            pages.setdefault(r.pop("Kernel Name"), []).append(r)
    return pages


def write_stall_log(page_text: str, path, header: str) -> None:
    """One kernel's source page cut to the instructions with warp-state samples: Address (from the kernel's
    start), Source, the samples in all and per reason (the issued-or-not reasons only, those with any sample),
    under `header` as '#' lines -- a few hundred rows of the megabytes of the page."""
    (rows,) = split_source_page(page_text).values()
    start = int(rows[0]["Address"], 16)
    total = "Warp Stall Sampling (All Samples)"
    sampled = [r for r in rows if float(r[total] or 0) > 0]
    reasons = [c for c in rows[0] if c.startswith("stall_") and "(" not in c
               and any(float(r[c] or 0) > 0 for r in sampled)]
    with open(path, "w", newline="") as fh:
        fh.writelines(f"# {line}\n" for line in header.splitlines())
        out = csv.writer(fh)
        out.writerow(("Address", "Source", total, *reasons))
        out.writerows((f"0x{int(r['Address'], 16) - start:04x}", r["Source"].strip(),
                       *(r[c] for c in (total, *reasons))) for r in sampled)


_REG = re.compile(r"\bR(\d+)(\.64)?\b")
_MEMORY_OPS = ("LDG", "STG", "RED", "ATOM")   # opcode prefixes: LDGSTS, REDG, ATOMG, ... too


def _registers(operands: str) -> set[int]:
    """Register numbers an operand list names (R12.64 is R12 and R13)."""
    regs = set()
    for n, wide in _REG.findall(operands):
        regs.update((int(n), int(n) + 1) if wide else (int(n),))
    return regs


def _split(sass: str) -> tuple[str, str, str]:
    """'@P0 IMAD.X R76, RZ, RZ, R66, P0' -> ('IMAD', 'R76', ' RZ, R66, P0'): opcode, first operand, rest."""
    text = sass.strip()
    if text.startswith("@"):
        text = text.split(None, 1)[1] if " " in text else ""
    op, _, operands = text.partition(" ")
    first, _, rest = operands.partition(",")
    return op.split(".")[0], first.strip(), rest


def register_waits(rows: list[dict[str, str]], column: str = "stall_long_sb", top: int = 3,
                   window: int = 64) -> list[dict]:
    """The `top` instructions with the most samples in `column`, each with the nearest earlier global-memory
    instruction (LDG, STG, RED, ATOM, LDGSTS) that reads a register this one overwrites, or None. A warp may
    not overwrite a register that a memory instruction still has to read; the wait for that shows up as
    long scoreboard on the instruction that overwrites it. "Earlier" looks back `window` instructions in
    address order and wraps around the end, for an instruction at the top of a loop whose memory
    instructions sit at its bottom ("wrapped": True)."""
    def samples(r):
        return float(r.get(column) or 0)

    found = []
    for i in sorted(range(len(rows)), key=lambda i: -samples(rows[i]))[:top]:
        op, dst, _ = _split(rows[i]["Source"])
        written = _registers(dst) if not op.startswith(_MEMORY_OPS) else set()
        culprit = None
        for step in range(1, min(window, len(rows))):
            j = (i - step) % len(rows)
            jop, jfirst, jrest = _split(rows[j]["Source"])
            if jop.startswith(_MEMORY_OPS) and written & _registers(jfirst + "," + jrest):
                culprit = {"source": rows[j]["Source"].strip(), "distance": step, "wrapped": j > i}
                break
        found.append({"source": rows[i]["Source"].strip(), "samples": samples(rows[i]), "waits_for": culprit})
    return found
