"""The GPU's clock and power log recorded beside the repeated runs (results/h200/gpu_clocks.csv, nvidia-smi every
200 ms): how often the power cap held the SM clock down while the comparisons ran."""
from __future__ import annotations

import csv

from flashattn.book.notebook import md
from flashattn.measure.results import H200 as RESULTS

SW_POWER_CAP = 0x4          # NVML's clocks-event (throttle) reason bit for the software power cap


def clock_log(file="gpu_clocks.csv") -> dict | None:
    """Summary of the nvidia-smi samples taken during the repeated runs (every 200 ms): peak board
    power, how often the power cap held the clock down, and how low the SM clock went then."""
    path = RESULTS / file
    if not path.exists():
        return None
    busy = capped = 0
    peak_w, max_mhz, capped_mhz = 0.0, 0, []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh, skipinitialspace=True):
            mhz = int(row["clocks.current.sm [MHz]"].split()[0])
            watts = float(row["power.draw [W]"].split()[0])
            # newer drivers name the column clocks_event_reasons, older ones clocks_throttle_reasons
            reasons = int(row.get("clocks_event_reasons.active") or row["clocks_throttle_reasons.active"], 16)
            busy += mhz > 1000                              # idle samples sit at 345 MHz
            peak_w, max_mhz = max(peak_w, watts), max(max_mhz, mhz)
            if reasons & SW_POWER_CAP:
                capped += 1
                capped_mhz.append(mhz)
    return dict(busy_samples=busy, capped_samples=capped, peak_watts=peak_w, max_mhz=max_mhz,
                min_capped_mhz=min(capped_mhz) if capped_mhz else None)


def clock_table(file="gpu_clocks.csv"):
    c = clock_log(file)
    if c is None:
        return md(f"*No clock log recorded yet (`results/h200/{file}`).*")
    lines = ["| busy samples | power cap active | peak board power | SM clock | lowest SM clock under the cap |",
             "|--:|--:|--:|--:|--:|",
             f"| {c['busy_samples']} | {c['capped_samples']} samples | {c['peak_watts']:.0f} W | "
             f"up to {c['max_mhz']} MHz | {c['min_capped_mhz'] or '—'} MHz |"]
    return md("\n".join(lines))
