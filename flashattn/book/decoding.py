"""The Decoding chapter's arithmetic and its tables of the build steps and the splits (book/decoding.ipynb), each
computed from kernels/decode.cu or from the record results/h200/decode.json (flashattn.measure.decode_bench), so
that a cell showing one is a single call and no number in it is typed by hand.

- `intensity`, `intensity_table`: what one call must read (flashattn.measure.decode_bench's `bytes_moved` and
  `floor_us`, re-exported here), and why bandwidth is the only measure that matters;
- `record`, `part_rows`, `ok`, `not_recorded`, `dims_by_shape`, `blocks_per_split`, `slots`, `rule_now`: reading
  the record, and the split rule as the package applies it;
- `excerpt`: lines of kernels/decode.cu cut between two markers;
- `build_resources`, `variants_table`, `speedups`, `variant_lines`, `in_flight_table`: the builds of the variants
  part, with what ptxas gives them and Little's law on their bandwidth;
- `split_points`, `waves_table`, `rule_rows`, `rule_table`: the split sweep and the rule derived from it.

The chapter's other helpers: flashattn.book.decoding_figures (concept and measured figures),
flashattn.book.decoding_results (peers, targets, paged and ragged batches, profile, generation) and
flashattn.book.decoding_live (the cells that run on a GPU). A part not recorded yet gives one line saying so.
"""
from __future__ import annotations

import functools
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flashattn import decode
from flashattn.book.notebook import md
from flashattn.book.records import RESULTS, ceilings
from flashattn.loader import excerpt as loader_excerpt
from flashattn.measure import resources, results
from flashattn.measure.decode_bench import DATASHEET_BYTES_PER_S, bytes_moved, floor_us  # noqa: F401 (re-exported)

RECORD = RESULTS / "decode.json"
GENERATION = RESULTS / "generation.json"
PROFILES = {name: RESULTS / f"decode_{name}_profile.ncu-rep" for name in ("batch8_16k", "rows16_32k")}
COLUMNS = {"ours": "ours", "fa4": "FA4", "cudnn": "cuDNN", "fa2": "FA2"}
TILE_KEYS = 64                      # keys per K/V tile (DECODE_BC's default; the record's meta says it too)
ROWS = decode.ROWS_PER_BLOCK         # rows of one mma tile (kRows in kernels/decode.cu)
# The targets: at most cuDNN's time and at least 93% of the datasheet at batch8_16k, at most 125 µs at
# rows16_32k, at least 90% of the floor's speed at gqa64_8k, a paged cache within 5% of a contiguous one; a batch
# of lengths 1 to 32k costs what its total length costs (judged here: within 5% of the same total spread evenly).
CUDNN_FRACTION, BANDWIDTH_FRACTION, ROWS16_US, GQA_FLOOR_FRACTION, PAGED_SLACK = 1.0, 0.93, 125.0, 0.90, 0.05
RAGGED_SLACK = 0.05
PAGED_PROFILES = {"before": RESULTS / "decode_paged_profile_before.json",
                  "after": RESULTS / "decode_paged_profile.json"}


def intensity(M: int, G: int, element: int = 2) -> float:
    """FLOP per byte of K and V: per key and kv head, each of the M * G query rows does 2D FLOPs for q.k and
    2D for p.v, against 2D elements of K and V read once."""
    return (4 * M * G) / (2 * element)


def record(path: Path = RECORD) -> dict | None:
    return results.read_if_exists(path, "decode")


def part_rows(doc: dict | None, part: str) -> list[dict]:
    return [r for r in doc["rows"] if r.get("part") == part] if doc else []


def ok(r: dict | None) -> bool:
    return bool(r) and r.get("status") == "ok" and bool(r.get("median_us"))


def not_recorded(part: str, path: Path = RECORD) -> str:
    return (f"*Not recorded yet: the `{part}` part of `results/h200/{Path(path).name}` "
            f"(`python -m flashattn.measure.decode_bench --parts {part}`).*")


def sm_count(doc: dict | None) -> int:
    meta = (doc or {}).get("meta", {})
    return meta.get("sms") or (meta.get("device") or {}).get("sm_count") or 132


def tile_keys(doc: dict | None) -> int:
    return (doc or {}).get("meta", {}).get("tile_keys") or TILE_KEYS


def dims_by_shape(rows: list[dict]) -> dict[str, list[int]]:
    """shape name -> [B, H_q, H_kv, M, N, D], from the first row that carries them."""
    out = {}
    for r in rows:
        if r.get("dims") and r["shape"] not in out:
            out[r["shape"]] = r["dims"]
    return out


def blocks_per_split(dims) -> int:
    """Blocks of the split kernel per split: one per (sequence, kv head, 16 packed rows)."""
    B, H_q, H_kv, M, _, _ = dims
    return B * decode.blocks_per_sequence(M, H_q, H_kv)


def slots(doc: dict | None) -> int:
    """Block slots of the GPU: BLOCKS_PER_SM resident split blocks on each SM."""
    return sm_count(doc) * decode.BLOCKS_PER_SM


def rule_now(dims, doc: dict | None) -> int:
    """The split count flashattn.decode.choose_num_splits gives for this shape today."""
    B, H_q, H_kv, M, N, _ = dims
    return decode.splits_for(B, M, H_q, H_kv, N, tile_keys(doc), sm_count(doc))


def intensity_table(doc: dict | None = None):
    """Per shape of the record's peers part: its sizes, the bytes a call must read, the floor, and FLOP per
    byte against the H200's ridge (measured bf16 tensor rate over measured copy bandwidth)."""
    doc = record() if doc is None else doc
    dims = dims_by_shape(part_rows(doc, "peers"))
    if not dims:
        return md(not_recorded("peers"))
    c = ceilings()
    lines = ["| shape | B, H_q/H_kv, M, N | GB to read | floor µs | FLOP/byte |", "|---|---|--:|--:|--:|"]
    for name, (B, H_q, H_kv, M, N, D) in dims.items():
        nb = bytes_moved(B, H_q, H_kv, M, [N] * B, D)
        lines.append(f"| {name} | {B}, {H_q}/{H_kv}, {M}, {N // 1024}k | {nb / 1e9:.2f} | {floor_us(nb):,.1f} | "
                     f"{intensity(M, H_q // H_kv):.0f} |")
    return md("\n".join(lines) + f"\n\nbf16, D = 128; floor at 4.8 TB/s. The H200's ridge: {c['bf16'] / 1e12:,.0f} "
              f"TFLOP/s (bf16) over {c['dram'] / 1e12:.2f} TB/s (copy) = {c['bf16'] / c['dram']:,.0f} FLOP/byte.")


def excerpt(first: str, last: str | None = None) -> str:
    """kernels/decode.cu from the line containing `first` to the next containing `last`."""
    return loader_excerpt("decode", first, last)


@functools.cache
def build_resources(flags: tuple[str, ...], D: int = 128) -> dict:
    """ptxas's registers and spills of the timed kernel (bf16, D, non-causal, contiguous cache) built with
    `flags`, its dynamic shared memory (as launch() sizes it) and the blocks per SM they allow."""
    macros = {f.removeprefix("-D").split("=")[0]: int(f.split("=")[1]) for f in flags if "=" in f}
    stages, bulk, bc = macros.get("DECODE_STAGES", 2), macros.get("DECODE_BULK", 0), macros.get("DECODE_BC", TILE_KEYS)
    kernels = resources.compile_report("decode", "90", flags)
    name = f"split_kernel<__nv_bfloat16, {D}, {bc}, {stages}, 0, false, {str(bool(bulk)).lower()}>"   # 0: kContiguous
    k = next(k for k in kernels if name in k["name"])
    row_bytes = 2 * D + (16 if bulk else 0)
    ring = stages * 2 * bc * row_bytes
    merge = 4 * ROWS * (D + 4) * 4 + 2 * 4 * ROWS * 4
    smem = 128 + ROWS * D * 2 + max(ring, merge)
    occ = resources.occupancy(k["registers"], smem, 128)
    return dict(registers=k["registers"], spill_bytes=k["spill_store_bytes"], smem=smem, blocks_per_sm=occ["blocks"],
                limited_by=occ["limited_by"], in_flight_per_block=(stages - 1) * 2 * bc * 2 * D)


def variants_table(doc: dict | None = None, compile_builds: bool = True):
    """The builds of the variants part: per shape µs and TB/s (the fastest per shape in bold), and what ptxas
    gives the timed kernel of each build (registers, spills, blocks per SM)."""
    doc = record() if doc is None else doc
    rows = part_rows(doc, "variants")
    if not rows:
        return md(not_recorded("variants"))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    builds = list(dict.fromkeys(r["column"] for r in rows))
    got = {(r["column"], r["shape"]): r for r in rows}
    best = {s: min((r["median_us"] for r in rows if r["shape"] == s and ok(r)), default=None) for s in shapes}
    flags = {b: tuple(next(r for r in rows if r["column"] == b).get("flags") or ()) for b in builds}
    res = {}
    if compile_builds:
        with ThreadPoolExecutor(max_workers=len(builds)) as pool:
            res = dict(zip(builds, pool.map(build_resources, [flags[b] for b in builds])))
    head = "| build | registers (spills) | blocks/SM | " + " | ".join(f"{s}: µs (TB/s)" for s in shapes) + " |"
    lines = [head, "|---|--:|--:|" + "--:|" * len(shapes)]
    for b in builds:
        r = res.get(b)
        cells = [f"{r['registers']} ({r['spill_bytes']} B)" if r else "—", str(r["blocks_per_sm"]) if r else "—"]
        for s in shapes:
            x = got.get((b, s))
            if not ok(x):
                cells.append("—")
                continue
            us = f"{x['median_us']:,.1f}"
            cells.append(f"{f'**{us}**' if x['median_us'] == best[s] else us} ({x['tb_per_s']:.2f})")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    splits = ", ".join(f"{s}: {got[(builds[0], s)].get('num_splits')}" for s in shapes if (builds[0], s) in got)
    return md("\n".join(lines) + f"\n\nFixed splits ({splits}); fastest in bold. Registers: ptxas, for the timed "
              "kernel (bf16, D = 128, non-causal, contiguous).")


COMPARISONS = (("16-byte copies, 3 stages", "16-byte copies, 2 stages", "three stages → two"),
               ("16-byte copies, 2 stages", "2 stages, L2 prefetch 128 B", "two stages + L2::128B"),
               ("16-byte copies, 2 stages", "2 stages, L2 prefetch 256 B", "two stages + L2::256B"),
               ("16-byte copies, 2 stages", "2 stages, 3 blocks/SM", "two stages, 3 blocks/SM"),
               ("16-byte copies, 3 stages", "bulk rows, 3 stages", "three stages, bulk row copies"),
               ("2 stages, merge launched after the split", "16-byte copies, 2 stages",
                "merge launched after the split → as a dependent launch"))


def speedups(doc: dict | None, before: str, after: str) -> dict[str, float]:
    """shape -> time of `before` over time of `after` in the variants part (above 1: `after` is faster)."""
    got = {(r["column"], r["shape"]): r for r in part_rows(doc, "variants") if ok(r)}
    shapes = dict.fromkeys(s for _, s in got)
    return {s: got[(before, s)]["median_us"] / got[(after, s)]["median_us"] for s in shapes
            if (before, s) in got and (after, s) in got}


def variant_lines(doc: dict | None = None) -> str:
    """One line per change of COMPARISONS: faster or slower at how many shapes, by how much."""
    doc = record() if doc is None else doc
    out = []
    for before, after, what in COMPARISONS:
        x = speedups(doc, before, after)
        if not x:
            out.append(f"{what}: not recorded")
            continue
        faster = sum(v > 1 for v in x.values())
        change = [100 * (1 / v - 1) for v in x.values()]       # % change in time
        verdict = ("faster at every shape" if faster == len(x) else "slower at every shape" if faster == 0
                   else f"faster at {faster} of {len(x)} shapes")
        out.append(f"{what}: {verdict}, time {min(change):+.1f}% to {max(change):+.1f}%")
    return "\n".join(out)


def in_flight_table(doc: dict | None = None, shape: str = "batch8_16k",
                    builds=("16-byte copies, 2 stages", "16-byte copies, 3 stages")):
    """Little's law on the record: bytes in flight = bandwidth × latency, so the latency each byte waited is at
    most (blocks resident × the ring's bytes in flight per block) / the achieved bandwidth."""
    doc = record() if doc is None else doc
    rows = {r["column"]: r for r in part_rows(doc, "variants") if r["shape"] == shape and ok(r)}
    if not any(b in rows for b in builds):
        return md(not_recorded("variants"))
    lines = ["| build | blocks resident | in flight per block | in flight, whole GPU | achieved | "
             "latency = in flight / bandwidth |", "|---|--:|--:|--:|--:|--:|"]
    for b in builds:
        r = rows.get(b)
        if r is None:
            continue
        res = build_resources(tuple(r.get("flags") or ()), r["dims"][5])
        grid = blocks_per_split(r["dims"]) * (r.get("num_splits") or 1)
        resident = min(grid, sm_count(doc) * res["blocks_per_sm"])
        total = resident * res["in_flight_per_block"]
        bw = r["tb_per_s"] * 1e12
        lines.append(f"| {b} | {resident} | {res['in_flight_per_block'] / 1024:.0f} KB | {total / 1e6:.1f} MB | "
                     f"{r['tb_per_s']:.2f} TB/s | {total / bw * 1e6:.2f} µs |")
    return md("\n".join(lines) + f"\n\n{shape}. A block has at most (stages − 1) tiles in flight: upper bounds.")


def split_points(doc, shape):
    rows = [r for r in part_rows(doc, "splits") if r["shape"] == shape and ok(r)]
    fixed = sorted((r["num_splits"], r["median_us"]) for r in rows if r["column"] != "rule")
    rule = next((r for r in rows if r["column"] == "rule"), None)
    return fixed, rule


def waves_table(doc: dict | None = None, shape: str = "rows16_32k", only=None):
    """Per fixed split count at one shape: blocks, waves (blocks / slots), full waves, and the model time
    ceil(waves) / splits (each block's share of the keys times the waves it takes), beside the measured µs;
    both relative to the fastest fixed split."""
    doc = record() if doc is None else doc
    fixed, _ = split_points(doc, shape)
    dims = dims_by_shape(part_rows(doc, "splits")).get(shape)
    if not fixed or dims is None:
        return md(not_recorded("splits"))
    per, n = blocks_per_split(dims), slots(doc)
    model = {s: math.ceil(per * s / n) / s for s, _ in fixed}
    best_s, best_us = min(fixed, key=lambda p: p[1])
    lines = ["| splits | blocks | waves | model ⌈waves⌉ / splits | µs | measured |", "|--:|--:|--:|--:|--:|--:|"]
    for s, us in fixed:
        if only is None or s in only:
            lines.append(f"| {s} | {per * s} | {per * s / n:.2f} | {model[s] / model[best_s]:.2f} | {us:,.1f} | "
                         f"{us / best_us:.2f} |")
    return md("\n".join(lines) + f"\n\n{shape}, {n} block slots; model and measured relative to {best_s} splits.")


def rule_rows(doc: dict | None = None) -> list[dict]:
    """Per shape of the splits part: blocks unsplit, the recorded rule's choice and time, today's rule's choice
    and the time of that fixed split in the sweep, and the fastest fixed split."""
    doc = record() if doc is None else doc
    dims = dims_by_shape(part_rows(doc, "splits"))
    out = []
    for shape, d in dims.items():
        fixed, rule = split_points(doc, shape)
        if not fixed:
            continue
        now = rule_now(d, doc)
        best_s, best_us = min(fixed, key=lambda p: p[1])
        out.append(dict(shape=shape, blocks=blocks_per_split(d), rule_recorded=rule and rule["num_splits"],
                        rule_recorded_us=rule and rule["median_us"], rule_now=now,
                        rule_now_us=dict(fixed).get(now), best=best_s, best_us=best_us))
    return out


def rule_table(doc: dict | None = None):
    rows = rule_rows(doc)
    if not rows:
        return md(not_recorded("splits"))
    lines = ["| shape | blocks unsplit | rule as recorded: splits, µs | rule now: splits, µs | fastest fixed: "
             "splits, µs | now / fastest |", "|---|--:|--:|--:|--:|--:|"]
    for r in rows:
        rec = "—" if r["rule_recorded"] is None else f"{r['rule_recorded']}, {r['rule_recorded_us']:,.1f}"
        now = f"{r['rule_now']}, " + ("not swept" if r["rule_now_us"] is None else f"{r['rule_now_us']:,.1f}")
        ratio = "—" if r["rule_now_us"] is None else f"{r['rule_now_us'] / r['best_us']:.2f}"
        lines.append(f"| {r['shape']} | {r['blocks']} | {rec} | {now} | {r['best']}, {r['best_us']:,.1f} | {ratio} |")
    return md("\n".join(lines) + "\n\n*Rule now*: `choose_num_splits` today; its µs: that fixed split in the sweep.")
