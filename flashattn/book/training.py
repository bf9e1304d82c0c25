"""The book's training demonstration: one small GPT-style character model trained three times in lockstep,
with three attentions (flashattn, SDPA, SDPA in float32), on a CUDA GPU.

    python -m flashattn.book.training --steps 300 --json results/h200/train_demo.json

The model (flashattn.book.training_model) is a plain decoder whose attention is one pluggable function:
``flashattn`` (this project's operator, kernels/v6.cu and v6_backward.cu), ``sdpa`` (PyTorch's
scaled_dot_product_attention) and ``sdpa_fp32`` (the same on float32 copies with autocast off: the yardstick
for "the noise of bf16"). The data (flashattn.book.training_data) is the book's own prose.

Why the comparison is clean: every model is built from the same seed (identical initial weights), all of
them train in lockstep on the very same batch tensor at every step, and everything except the attention
call is the same code in the same precision (float32 weights, bf16 autocast on CUDA, no dropout). The
attentions all receive bf16 q, k, v from the autocast linear layer, so only the attention kernels differ.

Time per step is measured after training, on the trained models, with `flashattn.measure.timing.time_interleaved`
(CUDA events around one full step: forward, backward, optimizer; warm-ups; interleaved rounds; L2 flushed
before each step; median), so that the steps of the recorded curve are not the ones being timed.
Without a GPU, `--attn sdpa sdpa_fp32 --device cpu` trains the two PyTorch attentions (untimed).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from flashattn.book.training_data import CharData
from flashattn.book.training_model import ATTEND, ATTENTIONS, GPT, Config, build_model
from flashattn.measure import results
from flashattn.measure.results import environment
from flashattn.measure.timing import time_interleaved


def make_optimizer(model: GPT, cfg: Config) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]    # matrices decay; biases and norms do not
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def _autocast(cfg: Config, device):
    device = torch.device(device)
    if cfg.amp and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_step(model, opt, x, y, cfg: Config, step: int) -> torch.Tensor:
    """One optimizer step on (x, y); returns the loss before the update (a 0-d tensor, no host sync)."""
    for group in opt.param_groups:
        group["lr"] = cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    with _autocast(cfg, x.device):
        loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


@torch.no_grad()
def evaluate(model, x, y, cfg: Config, chunk: int = 16) -> float:
    """Mean loss over the fixed validation windows."""
    model.eval()
    total = torch.zeros((), device=x.device)
    for s in range(0, len(x), chunk):
        with _autocast(cfg, x.device):
            total += model(x[s:s + chunk], y[s:s + chunk]) * len(x[s:s + chunk])
    model.train()
    return (total / len(x)).item()


def train(cfg: Config, data: CharData, attns=("sdpa",), device="cpu", log=None) -> tuple[dict, dict, dict]:
    """Train one model per attention in lockstep: step s hands the same batch to every model.
    Returns ({attn: {"train_loss": [per step], "val_loss": [[step, loss], ...]}}, models, optimizers)."""
    if "flashattn" in attns and torch.device(device).type != "cuda":
        raise ValueError(f"attns: 'flashattn' runs on CUDA only; device is {device!r} (train with 'sdpa' there)")
    cfg.vocab_size = data.vocab_size
    models = {a: build_model(cfg, a, device) for a in attns}
    opts = {a: make_optimizer(m, cfg) for a, m in models.items()}
    gen = torch.Generator().manual_seed(cfg.seed + 1)          # data order: independent of the models
    vx, vy = data.val_windows(cfg.block_size, device)
    losses = {a: [] for a in attns}
    val = {a: [] for a in attns}
    for step in range(cfg.steps + 1):
        if step % cfg.eval_every == 0 or step == cfg.steps:
            for a, m in models.items():
                val[a].append([step, evaluate(m, vx, vy, cfg)])
            if log:
                log(f"step {step:4d}  " + "  ".join(f"{a}: val {val[a][-1][1]:.4f}" for a in attns))
        if step == cfg.steps:
            break
        x, y = data.batch(gen, cfg.batch_size, cfg.block_size, device)
        for a in attns:
            losses[a].append(train_step(models[a], opts[a], x, y, cfg, step))
    out = {a: {"train_loss": [float(v) for v in losses[a]], "val_loss": val[a]} for a in attns}
    return out, models, opts


STEP_TIMING = dict(warmup=10, repetitions=300, rounds=10)   # a host-bound step: its time varies by 10-30% call to call


def time_steps(models: dict, opts: dict, data: CharData, cfg: Config, warmup=STEP_TIMING["warmup"],
               repetitions=STEP_TIMING["repetitions"], rounds=STEP_TIMING["rounds"]) -> dict:
    """Median time of one training step per attention (CUDA only), with flashattn.measure.timing's
    interleaved rounds."""
    device = next(iter(models.values())).tok.weight.device
    x, y = data.batch(torch.Generator().manual_seed(cfg.seed + 2), cfg.batch_size, cfg.block_size, device)
    calls = {a: ((lambda m=m, o=opts[a]: train_step(m, o, x, y, cfg, cfg.steps)), contextlib.nullcontext)
             for a, m in models.items()}
    timed = time_interleaved(calls, warmup=warmup, repetitions=repetitions, rounds=rounds, max_seconds=None)
    return {a: (t.summary() if not isinstance(t, Exception) else {"error": str(t)}) for a, t in timed.items()}


# --------------------------------------------------------------------------------------------- record
def run(cfg: Config, attns=ATTENTIONS, device=None, log=print, argv=None) -> dict:
    """Train every attention in `attns` from the same seed, time their steps (CUDA), return the record."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    data = CharData.from_repository()
    curves, models, opts = train(cfg, data, attns, device, log)
    timing = time_steps(models, opts, data, cfg) if device.type == "cuda" else None
    meta = environment(argv, prog="python -m flashattn.book.training")
    params = sum(p.numel() for p in next(iter(models.values())).parameters())
    record = {"meta": meta, "config": dict(asdict(cfg), n_embd=cfg.n_embd, parameters=params, device=str(device)),
              "data": data.describe(), "attentions": {}}
    for a in attns:
        record["attentions"][a] = dict(curves[a], final_train_loss=curves[a]["train_loss"][-1],
                                       final_val_loss=curves[a]["val_loss"][-1][1],
                                       step_time=None if timing is None else timing[a])
    record["timing"] = ("one full training step (forward, backward, AdamW) of the trained model on one fixed "
                        "batch, flashattn.measure.timing.time_interleaved: {warmup} warm-ups, {repetitions} calls in "
                        "{rounds} interleaved rounds, L2 flushed before each".format(**STEP_TIMING)
                        if timing is not None else "not timed (no CUDA device)")
    return record


def write_json(record: dict, path: Path) -> None:
    """The record as a flashattn.measure.results record of kind training: one row per attention, the
    model's config as settings, the data and the timing note in meta."""
    meta = dict(record["meta"], data=record["data"], timing=record["timing"])
    rows = [{"attention": a, **curves} for a, curves in record["attentions"].items()]
    results.write(path, "training", rows, meta, record["config"])


def read_json(path: Path) -> dict | None:
    """The record written by write_json, as `run` returned it; None when the file does not exist."""
    doc = results.read_if_exists(path, "training")
    if doc is None:
        return None
    meta = dict(doc["meta"])
    data, timing = meta.pop("data"), meta.pop("timing")
    return {"meta": meta, "config": doc["settings"], "data": data,
            "attentions": {r["attention"]: {k: v for k, v in r.items() if k != "attention"} for r in doc["rows"]},
            "timing": timing}


# -------------------------------------------------------------------------------------------- figures
LABELS = {"flashattn": "flashattn.attention (V6)", "sdpa": "SDPA", "sdpa_fp32": "SDPA, float32 attention"}


def _running_mean(values, k: int):
    """(steps, means): the mean of each window of k consecutive values, placed at the window's last step."""
    x = torch.as_tensor(values, dtype=torch.float64)
    k = max(1, min(k, len(x)))
    return range(k - 1, len(x)), x.unfold(0, k, 1).mean(dim=1)


def plot(record: dict, smooth: int = 10):
    """Both loss curves in one plot (training loss as a running mean, validation loss as markers), and
    beside it how far each bf16 run strays from the float32-attention run: the noise of bf16."""
    # pyplot is slow to import and picks its backend when imported: only a notebook that draws needs it
    import matplotlib.pyplot as plt
    att = record["attentions"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    styles = {"sdpa": dict(color="C0"), "flashattn": dict(color="C3", ls="--"), "sdpa_fp32": dict(color="0.5", lw=0.8)}
    for name, r in att.items():
        a.plot(*_running_mean(r["train_loss"], smooth), label=f"{LABELS.get(name, name)}: training",
               **styles.get(name, {}))
        steps, vals = zip(*r["val_loss"])
        a.plot(steps, vals, "o", ms=4, mfc="none", label=f"{LABELS.get(name, name)}: validation",
               color=styles.get(name, {}).get("color"))
    a.set(xlabel="step", ylabel="cross-entropy [nats per character]",
          title=f"Training loss (mean of {smooth} steps) and validation loss")
    a.legend(fontsize=7.5)
    a.grid(alpha=0.3)
    if "sdpa_fp32" not in att:
        b.axis("off")
        plt.show()
        return
    ref = torch.tensor(att["sdpa_fp32"]["train_loss"], dtype=torch.float64)
    for name in ("sdpa", "flashattn"):
        if name in att:
            gap = (torch.tensor(att[name]["train_loss"], dtype=torch.float64) - ref).abs()
            b.plot(*_running_mean(gap, smooth), label=f"|{LABELS[name]} − float32|", **styles[name])
    b.set(xlabel="step", ylabel="|Δ training loss|", yscale="log",
          title=f"Distance from the float32-attention run (mean of {smooth} steps)")
    b.legend(fontsize=7.5)
    b.grid(alpha=0.3, which="both")
    plt.show()


def agreement(record: dict) -> dict:
    """How far each bf16 run's training loss strays from the float32-attention run (largest and mean
    per-step distance), with every run's final losses: the numbers behind "agrees to the noise of bf16"."""
    att = record["attentions"]
    out = {name: {"final_train_loss": r["final_train_loss"], "final_val_loss": r["final_val_loss"]}
           for name, r in att.items()}
    if "sdpa_fp32" in att:
        ref = torch.tensor(att["sdpa_fp32"]["train_loss"], dtype=torch.float64)
        for name, r in att.items():
            d = (torch.tensor(r["train_loss"], dtype=torch.float64) - ref).abs()
            out[name].update(max_distance=d.max().item(), mean_distance=d.mean().item())
    return out


def summary_table(record: dict) -> str:
    """Final losses and time per step of each attention (markdown)."""
    att = record["attentions"]
    base = (att.get("sdpa") or {}).get("step_time") or {}
    lines = ["| attention | final training loss | final validation loss | ms per step (median) | vs. SDPA |",
             "|---|--:|--:|--:|--:|"]
    for name, r in att.items():
        t = r.get("step_time") or {}
        ms = t.get("median_us", 0) / 1e3 if "median_us" in t else None
        ratio = base["median_us"] / t["median_us"] if ms and "median_us" in base and name != "sdpa" else None
        lines.append(f"| {LABELS.get(name, name)} | {r['final_train_loss']:.4f} | {r['final_val_loss']:.4f} | "
                     f"{'failed' if 'error' in t else '—' if ms is None else f'{ms:.2f}'} | "
                     f"{'—' if ratio is None else f'{ratio:.2f}×'} |")
    c, m, d = record["config"], record["meta"], record["data"]
    dev = (m.get("device") or {}).get("name", c.get("device", "?"))
    commit = ((m.get("git") or {}).get("commit") or "uncommitted")[:10]
    return ("\n".join(lines) + f"\n\n{c['n_layer']} layers, {c['n_head']} heads of D={c['head_dim']}, context "
            f"{c['block_size']}, batch {c['batch_size']}, {c['parameters']:,} parameters, {c['steps']} steps; "
            f"{d['chars']:,} characters of the book ({d['vocab_size']} distinct). Ratios above 1: faster than "
            f"SDPA. Time per step: {record.get('timing', 'not recorded')}. Recorded on {dev} (torch "
            f"{m.get('torch', '?')}, commit {commit}).")


# ------------------------------------------------------------------------------------------------ cli
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashattn.book.training", description=__doc__.split("\n\n")[0])
    d = Config()
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (default: %(default)s)")
    p.add_argument("--attn", nargs="+", choices=tuple(ATTEND), default=list(ATTENTIONS),
                   help="attentions to train side by side (default: %(default)s; flashattn and flashattn_hopper, "
                        "which trains on kernels/v8_backward.cu, need a CUDA GPU, the latter a Hopper one)")
    for name in ("block_size", "n_layer", "n_head", "head_dim", "batch_size", "eval_every", "seed"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name),
                       help="(default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="(default: %(default)s)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the record here")
    args = p.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1:
        p.error("--steps and --eval-every must be >= 1")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if {"flashattn", "flashattn_hopper"} & set(args.attn) and device.type != "cuda":
        where = f"--device is {args.device}" if args.device else "this machine has no CUDA GPU"
        print(f"{p.prog}: the flashattn attention runs on a CUDA GPU only and {where}; "
              "train the PyTorch attentions with --attn sdpa (or --attn sdpa sdpa_fp32)", file=sys.stderr)
        return 2
    cfg = Config(**{k: getattr(args, k) for k in ("steps", "block_size", "n_layer", "n_head", "head_dim",
                                                 "batch_size", "eval_every", "seed", "lr")})
    record = run(cfg, tuple(args.attn), device, argv=argv)
    print(summary_table(record))
    if args.json:
        write_json(record, args.json)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
