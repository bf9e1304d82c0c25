"""A small GPT-style character model that trains with either attention: the book's training demonstration.

    python -m flashattn.book.training --steps 300 --json results/h200/train_demo.json

The model is a plain decoder (token and position embeddings, pre-norm blocks of causal self-attention and
an MLP, a tied output layer) whose attention is one pluggable function of q, k, v [B, H, T, D]:

* ``flashattn``: this project's operator, ``flashattn.autograd.attention(q, k, v, causal=True)``, whose
  backward is kernels/v6_backward.cu (CUDA only);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` with PyTorch's own
  backend choice;
* ``sdpa_fp32``: the same call on float32 copies of q, k, v with autocast off. It is the yardstick for
  "the noise of bf16": how far PyTorch's own bf16 attention moves the loss from a float32 attention.

Why the comparison is clean: every model is built from the same seed (identical initial weights), all of
them train in lockstep on the very same batch tensor at every step, and everything except the attention
call is the same code in the same precision (float32 weights, bf16 autocast on CUDA, no dropout). The
attentions all receive bf16 q, k, v from the autocast linear layer, so only the attention kernels differ.

The data is the book itself: the markdown cells of book/*.ipynb, then book/*.md, then README.md, read
character by character; the first 90% of each document is the training split, the last 10% of each the
validation split.

Time per step is measured after training, on the trained models, with `flashattn.measure.timing.time_interleaved`
(CUDA events around one full step: forward, backward, optimizer; warm-ups; interleaved rounds; L2 flushed
before each step; median), so that the steps of the recorded curve are not the ones being timed.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from flashattn.loader import REPO_ROOT

ATTENTIONS = ("sdpa", "flashattn", "sdpa_fp32")


# --------------------------------------------------------------------------------------------- data
def text_sources(root: Path = REPO_ROOT) -> list[Path]:
    """The files the corpus is read from, in corpus order."""
    book = root / "book"
    return sorted(book.glob("*.ipynb")) + sorted(book.glob("*.md")) + [root / "README.md"]


def read_source(path: Path) -> str:
    """A notebook's markdown cells (the prose, not the code), or a markdown file as it is."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return "\n\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                           for c in cells if c["cell_type"] == "markdown")
    return path.read_text(encoding="utf-8")


class CharData:
    """The corpus as character ids. Each document's first 90% goes to the training split and its last 10%
    to the validation split, so that validation reads the same kind of text as training (the README's
    tables are not all in one split)."""

    def __init__(self, documents: list[str], val_fraction: float = 0.1):
        documents = [d for d in documents if d]
        self.text = "\n\n".join(documents)
        if len(self.text) < 2:
            raise ValueError("documents: the corpus needs at least two characters")
        self.chars = sorted(set(self.text))                    # the vocabulary, one id per character
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        cut = [len(d) - int(len(d) * val_fraction) for d in documents]
        self.train = self.encode("\n\n".join(d[:c] for d, c in zip(documents, cut)))
        self.val = self.encode("\n\n".join(d[c:] for d, c in zip(documents, cut)))

    @classmethod
    def from_repository(cls, root: Path = REPO_ROOT, val_fraction: float = 0.1) -> CharData:
        data = cls([read_source(p) for p in text_sources(root)], val_fraction)
        data.sources = [str(p.relative_to(root)) for p in text_sources(root)]
        return data

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def describe(self) -> dict:
        return {"sources": getattr(self, "sources", None), "chars": len(self.text), "vocab_size": self.vocab_size,
                "train_chars": len(self.train), "val_chars": len(self.val),
                "sha256": hashlib.sha256(self.text.encode("utf-8")).hexdigest()}

    def batch(self, gen: torch.Generator, batch_size: int, block_size: int, device="cpu"):
        """Random training windows x and their next characters y, [batch_size, block_size] each; the
        positions come from `gen` alone, so every model that is handed this batch sees the same one."""
        if len(self.train) <= block_size:
            raise ValueError(f"block_size: the training split is only {len(self.train)} characters long")
        start = torch.randint(len(self.train) - block_size, (batch_size,), generator=gen)
        x = torch.stack([self.train[s:s + block_size] for s in start.tolist()])
        y = torch.stack([self.train[s + 1:s + 1 + block_size] for s in start.tolist()])
        return x.to(device), y.to(device)

    def val_windows(self, block_size: int, device="cpu"):
        """Every non-overlapping window of the validation split: a fixed set, no sampling noise."""
        n = (len(self.val) - 1) // block_size
        if n < 1:
            raise ValueError(f"block_size: the validation split is only {len(self.val)} characters long")
        x = self.val[:n * block_size].view(n, block_size)
        y = self.val[1:n * block_size + 1].view(n, block_size)
        return x.to(device), y.to(device)


# -------------------------------------------------------------------------------------------- model
@dataclass
class Config:
    vocab_size: int = 0            # set from the data
    block_size: int = 256          # context length T
    n_layer: int = 4
    n_head: int = 4
    head_dim: int = 64             # D: the kernel takes 64 and 128
    batch_size: int = 16
    steps: int = 300
    lr: float = 1e-3
    warmup_steps: int = 20         # linear learning-rate warm-up, then constant
    weight_decay: float = 0.1
    eval_every: int = 25
    seed: int = 0
    amp: bool = True               # bf16 autocast on CUDA (float32 weights and optimizer state)

    @property
    def n_embd(self) -> int:
        return self.n_head * self.head_dim


def attend_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attend_sdpa_fp32(q, k, v):
    # autocast would cast SDPA's inputs back to bf16; turn it off to get a float32 attention
    with torch.autocast(device_type=q.device.type, enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)


def attend_flashattn(q, k, v):
    if q.device.type != "cuda":
        raise ValueError("attn='flashattn' needs CUDA tensors (the kernels run on the GPU); use attn='sdpa' on CPU")
    from flashattn.autograd import attention
    return attention(q, k, v, causal=True)


ATTEND = {"sdpa": attend_sdpa, "flashattn": attend_flashattn, "sdpa_fp32": attend_sdpa_fp32}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config, attend):
        super().__init__()
        self.n_head, self.head_dim, self.attend = cfg.n_head, cfg.head_dim, attend
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # [B, H, T, D]
        y = self.attend(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))      # autocast casts y for the projection


class Block(nn.Module):
    def __init__(self, cfg: Config, attend):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg, attend)
        C = cfg.n_embd
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: Config, attn: str = "sdpa"):
        super().__init__()
        if attn not in ATTEND:
            raise ValueError(f"attn must be one of {', '.join(ATTEND)}; got {attn!r}")
        if cfg.vocab_size < 1:
            raise ValueError("cfg.vocab_size: set it from the data (CharData.vocab_size)")
        self.cfg, self.attn = cfg, attn
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, ATTEND[attn]) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight                     # tied input and output embeddings
        self.apply(self._init)
        for block in self.blocks:                              # GPT-2: residual branches start small
            nn.init.normal_(block.attn.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def build_model(cfg: Config, attn: str, device="cpu") -> GPT:
    """The model for `attn`, its weights drawn from `cfg.seed` alone: every attention gets the same start."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = GPT(cfg, attn)
    return model.to(device)


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


STEP_TIMING = dict(warmup=10, repetitions=60, rounds=6)


def time_steps(models: dict, opts: dict, data: CharData, cfg: Config, warmup=STEP_TIMING["warmup"],
               repetitions=STEP_TIMING["repetitions"], rounds=STEP_TIMING["rounds"]) -> dict:
    """Median time of one training step per attention (CUDA only), with flashattn.measure.timing's
    interleaved rounds."""
    from flashattn.measure.timing import time_interleaved
    device = next(iter(models.values())).tok.weight.device
    x, y = data.batch(torch.Generator().manual_seed(cfg.seed + 2), cfg.batch_size, cfg.block_size, device)
    calls = {a: ((lambda m=m, o=opts[a]: train_step(m, o, x, y, cfg, cfg.steps)), contextlib.nullcontext)
             for a, m in models.items()}
    timed = time_interleaved(calls, warmup=warmup, repetitions=repetitions, rounds=rounds, max_seconds=None)
    return {a: (t.summary() if not isinstance(t, Exception) else {"error": str(t)}) for a, t in timed.items()}


# --------------------------------------------------------------------------------------------- record
def run(cfg: Config, attns=ATTENTIONS, device=None, log=print, argv=None) -> dict:
    """Train every attention in `attns` from the same seed, time their steps (CUDA), return the record."""
    from flashattn.measure.bench import environment
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
    from flashattn.measure.bench import write_json as write
    write(record, Path(path), append=False)


def read_json(path: Path) -> dict | None:
    """The record written by write_json (the last run in the file), None when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    return json.loads(path.read_text())["runs"][-1]


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
    p.add_argument("--attn", nargs="+", choices=ATTENTIONS, default=list(ATTENTIONS),
                   help="attentions to train side by side (default: all)")
    for name in ("block_size", "n_layer", "n_head", "head_dim", "batch_size", "eval_every", "seed"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name),
                       help="(default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="(default: %(default)s)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the record here")
    args = p.parse_args(argv)
    if args.steps < 1 or args.eval_every < 1:
        p.error("--steps and --eval-every must be >= 1")
    cfg = Config(**{k: getattr(args, k) for k in ("steps", "block_size", "n_layer", "n_head", "head_dim",
                                                 "batch_size", "eval_every", "seed", "lr")})
    record = run(cfg, tuple(args.attn), args.device, argv=argv)
    print(summary_table(record))
    if args.json:
        write_json(record, args.json)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
