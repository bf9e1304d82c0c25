"""What every chapter's first cell needs: where the notebook runs, Markdown output, and what a version takes.

The book's helpers live in modules named for what they hold: `flashattn.book.records` reads the results recorded
on the H200 (results/), `flashattn.book.live` runs kernels now when there is a GPU, `flashattn.book.tiles` does the
tile and occupancy arithmetic, `flashattn.book.figures` draws the measured performance and
`flashattn.book.diagrams` how the kernels divide the work. Each helper returns Markdown or
draws a figure, so a code cell stays one readable line.
"""
from __future__ import annotations

import torch

from flashattn.measure.table import label
from flashattn.versions import ARCH_FEATURES, INFO, VERSIONS

PRIMARY = dict(B=4, H=12, L=2048, D=64)       # the shape every chapter times and profiles


def gpu() -> bool:
    return torch.cuda.is_available()


def md(text: str):
    """`text` as a Markdown display object (rendered in the book)."""
    # IPython comes with Jupyter, not with the package's dependencies: the command-line tools never get here
    from IPython.display import Markdown
    return Markdown(text)


NO_GPU = "No CUDA GPU on this machine: {what} recorded on the H200 are shown instead."


LIVE_ONLY = "No CUDA GPU on this machine: this experiment runs live only, so it shows nothing here."


def setup() -> None:
    """Matplotlib defaults for the book's figures and one line saying where this notebook runs."""
    # pyplot is slow to import and picks its backend when imported: only a chapter that draws needs it
    import matplotlib
    import matplotlib.pyplot as plt
    matplotlib.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "font.size": 10,
                                "axes.titlesize": 11, "figure.max_open_warning": 0,
                                "svg.hashsalt": "flashattn", "image.interpolation": "nearest"})
    plt.close("all")
    if gpu():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        print(f"{p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs), torch {torch.__version__}: "
              f"cells run live.")
    else:
        print(f"No CUDA GPU (torch {torch.__version__}): kernels are compiled; cells that need a GPU say so, and "
              f"recorded H200 results are read from results/h200.")


def _dtypes(i) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in i.dtypes)


def _exact_archs(i) -> str:
    """'Hopper only (sm_90a: wgmma, TMA)' for a version built for exact architectures."""
    return "; ".join(f"{ARCH_FEATURES[a][0]} only (sm_{a.replace('.', '')}: {ARCH_FEATURES[a][1]})"
                     if a in ARCH_FEATURES else f"sm_{a.replace('.', '')} only" for a in i.archs)


def _backward_dims(i) -> str:
    """" (backward: 64, 128)" where the version's backward takes fewer head dims than its forward (a forward-only
    head dim refuses inputs that require grad), else nothing."""
    return "" if i.backward_head_dims is None else " (backward: " + ", ".join(map(str, i.backward_head_dims)) + ")"


def requirements(version: str):
    """What the kernel accepts and which GPUs it needs, from flashattn.versions."""
    i = INFO[version]
    dims = f"any D from 1 to {i.max_head_dim}" if i.head_dims is None else \
        "D in {" + ", ".join(map(str, i.head_dims)) + "}" + (f" (other D run {i.fallback})" if i.fallback else "")
    dims += _backward_dims(i)
    if i.archs:
        gpu_line = _exact_archs(i)
    else:
        sm = f"{i.min_sm[0]}.{i.min_sm[1]}"
        gpus = {"7.0": "Volta (V100) or newer: any GPU that current PyTorch supports",
                "8.0": "Ampere (A100, RTX 30xx) or newer: cp.async, ldmatrix and bf16 mma.sync need sm_80"}
        gpu_line = f"compute capability {sm}+, {gpus.get(sm, 'or newer')}"
    lines = ["| | |", "|---|---|", f"| dtypes | {_dtypes(i)} |", f"| head dim | {dims} |",
             f"| sequence lengths | any M, N >= 1{'; M = N only' if i.self_attention_only else ''} |",
             f"| causal | {'yes' if i.causal else 'no'} |", f"| GPU | {gpu_line} |"]
    return md("\n".join(lines))


def gpu_table():
    """Every version's dtypes, head dims and the oldest GPU generation its instructions allow."""
    gen = {(7, 0): "Volta / sm_70 and newer", (8, 0): "Ampere / sm_80 and newer (A100, RTX 30xx, L4, H100, H200)"}
    lines = ["| version | dtypes | head dims | M ≠ N | causal | needs |", "|---|---|---|---|---|---|"]
    for v in VERSIONS:
        i = INFO[v]
        dims = f"1–{i.max_head_dim}" if i.head_dims is None else ", ".join(map(str, i.head_dims)) + \
            (f" (others via {i.fallback})" if i.fallback else "")
        dims += _backward_dims(i)
        if not i.kernel:
            dims, need = "any", "whatever PyTorch supports"
        elif i.archs:
            need = _exact_archs(i)
        else:
            need = gen.get(tuple(i.min_sm), f"sm_{i.min_sm[0]}{i.min_sm[1]}")
        lines.append(f"| {label(v)} | {_dtypes(i)} | {dims} | {'no' if i.self_attention_only else 'yes'} | "
                     f"{'yes' if i.causal else 'no'} | {need} |")
    return md("\n".join(lines))
