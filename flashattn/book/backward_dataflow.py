"""The backward's dataflow for one key tile: what a block of `bwd_dkdv_split` (kernels/v6_backward.cu) loads
once, what streams through it per query tile, where each of the five products lives, and why dK_j, dV_j
stay in registers while dQ_i leaves the block to be summed in global memory.

The figure's labels are read from the kernel file (the shared-memory arrays of bwd_dkdv_split, its dK/dV
accumulators and the PTX of the dQ reduction), so a renamed array or a different reduction breaks
`kernel_facts` and its test rather than leaving a stale picture. `key_tile_backward` is the same dataflow
in numpy, one key tile at a time; `worked_example` runs it on a tiny problem and compares dQ, dK, dV with
float64 autograd of the plain formulas. Nothing here needs a GPU. book/_static/concepts/backward_dataflow.png
is FIGURES["backward_dataflow"]() saved with savefig(path, dpi=110, bbox_inches="tight").
"""
from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import FancyBboxPatch, Patch

from flashattn.book.figures import show_or_return
from flashattn.loader import KERNELS_DIR, REPO_ROOT

KERNEL = KERNELS_DIR / "v6_backward.cu"
OUTPUT = REPO_ROOT / "book" / "_static" / "concepts" / "backward_dataflow.png"
# The shared-memory arrays the figure draws, by the name bwd_dkdv_split gives them.
SHARED = ("sK", "sV", "sQ", "sdO", "sL", "sDv", "sP", "sdS", "sdQ")


# ------------------------------------------------------------------------------------ read from the kernel
def kernel_facts(path: Path = KERNEL) -> dict:
    """What the figure takes from the kernel file: `shared` {array: its declaration comment} of
    bwd_dkdv_split, `accumulators` (the register arrays of dV_j and dK_j), `bulk` (the PTX of the per-tile
    dQ reduction), `red` (the per-element one), `fence` (the proxy fence before the bulk copy reads shared
    memory). Raises ValueError naming what is missing when the file no longer has it."""
    text = path.read_text()
    start = text.find("    bwd_dkdv_split(const")
    end = text.find("\n}\n", start)
    if start < 0 or end < 0:
        raise ValueError(f"{path.name} has no bwd_dkdv_split kernel")
    body = text[start:end]
    shared = {m[1]: m[2].strip() for m in re.finditer(r"^\s*(?:T|float)\*\s+(s\w+)\s*=[^;]*;\s*//\s*(.*)$", body,
                                                       re.MULTILINE)}
    acc = re.search(r"float\s+(dv)\[[^;]*?,\s*(dk)\[", body)
    bulk = re.search(r'"(cp\.reduce\.async\.bulk[\w.:]*)', text)
    red = re.search(r'"(red\.global\.add[\w.]*)', text)
    fence = re.search(r'"(fence\.proxy\.async[\w.:]*)', text)
    missing = [name for name in SHARED if name not in shared]
    missing += [what for what, hit in (("dv/dk accumulators", acc), ("cp.reduce.async.bulk", bulk),
                                       ("red.global.add", red), ("fence.proxy.async", fence)) if hit is None]
    if "bulk_reduce_add_f32(" not in body:
        missing.append("the bulk reduction's call in bwd_dkdv_split")
    if missing:
        raise ValueError(f"{path.name} no longer has {', '.join(missing)}: update flashattn/book/backward_dataflow.py")
    return dict(shared=shared, accumulators=(acc[1], acc[2]), bulk=bulk[1], red=red[1], fence=fence[1])


# ------------------------------------------------------------------------------------ the same dataflow, numpy
def key_tile_backward(Q, K_j, V_j, dO, lse, Dvec, dq_acc, tau: float, B_r: int, first_key: int = 0,
                      causal: bool = False):
    """One block of the key-tile kernel: K_j, V_j stay put, every query tile i streams through, dV_j and dK_j
    accumulate across the loop (the kernel's registers) and each tile's dQ_i contribution is added into
    `dq_acc` (the float32 accumulator in global memory), in place. Rows of Q, dO, lse, Dvec are queries;
    K_j, V_j the block's keys, starting at key `first_key`. Returns (dK_j, dV_j); dQ = tau * dq_acc once
    every block has added its part."""
    M = Q.shape[0]
    dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)
    for i0 in range(0, M, B_r):
        rows = slice(i0, i0 + B_r)
        S = Q[rows] @ K_j.T                                     # recomputed, never stored by the forward
        P = np.exp(tau * S - lse[rows, None])                   # already normalised: lse is the forward's
        if causal:
            keys = first_key + np.arange(K_j.shape[0])
            P = np.where(keys[None, :] <= np.arange(i0, i0 + P.shape[0])[:, None], P, 0.0)
        dV_j += P.T @ dO[rows]
        dP = dO[rows] @ V_j.T
        dS = P * (dP - Dvec[rows, None])
        dK_j += dS.T @ Q[rows]
        dq_acc[rows] += dS @ K_j                                # leaves the block: other blocks add here too
    return tau * dK_j, dV_j


def worked_example(B_r: int = 3, B_c: int = 4, D: int = 4, query_tiles: int = 2, key_tiles: int = 1,
                   causal: bool = False, seed: int = 0) -> dict:
    """A tiny problem (query_tiles * B_r queries, key_tiles * B_c keys, head dim D) in float64: the forward
    gives O and lse, D_i = rowsum(dO_i * O_i), then one `key_tile_backward` per key tile. Returns the
    dataflow's dQ, dK, dV, autograd's (torch, float64, CPU) and the largest absolute difference of each."""
    rng = np.random.default_rng(seed)
    M, N = query_tiles * B_r, key_tiles * B_c
    if causal and M != N:
        raise ValueError("the causal example needs as many queries as keys (query_tiles * B_r == key_tiles * B_c)")
    Q, dO = rng.standard_normal((M, D)), rng.standard_normal((M, D))
    K, V = rng.standard_normal((N, D)), rng.standard_normal((N, D))
    tau = D ** -0.5
    S = tau * Q @ K.T
    if causal:                                                  # M == N here: row i sees keys 0..i
        S = np.where(np.tril(np.ones((M, N), dtype=bool)), S, -np.inf)
    lse = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
    O = np.exp(S - lse[:, None]) @ V
    Dvec = (dO * O).sum(1)                                      # bwd_prep's D_i
    dq_acc = np.zeros((M, D))
    dK, dV = np.zeros_like(K), np.zeros_like(V)
    for j0 in range(0, N, B_c):                                 # the blocks, in any order
        dK[j0:j0 + B_c], dV[j0:j0 + B_c] = key_tile_backward(Q, K[j0:j0 + B_c], V[j0:j0 + B_c], dO, lse, Dvec,
                                                             dq_acc, tau, B_r, first_key=j0, causal=causal)
    dQ = tau * dq_acc                                           # bwd_convert

    q, k, v = (torch.tensor(a, requires_grad=True) for a in (Q, K, V))
    s = tau * q @ k.T
    if causal:
        s = s.masked_fill(~torch.ones(M, N, dtype=torch.bool).tril(), float("-inf"))
    out = torch.softmax(s, dim=-1) @ v
    ref = torch.autograd.grad(out, (q, k, v), torch.tensor(dO))
    got = dict(dQ=dQ, dK=dK, dV=dV)
    ref = {name: r.numpy() for name, r in zip(got, ref)}
    return dict(got=got, ref=ref, max_abs_diff={n: float(np.abs(got[n] - ref[n]).max()) for n in got},
                shape=dict(M=M, N=N, D=D, B_r=B_r, B_c=B_c))


# ------------------------------------------------------------------------------------ the figure
BAND = {"global": "#e8eef7", "shared": "#eef6e8", "registers": "#fbefe3"}
FLOW = {"once": "#1f5fa8", "per tile": "#d2691e", "at the end": "#2e8b57"}


def _node(ax, x, y, w, h, title, sub="", color="white", edge="0.35", fs=11):
    """A box with a bold title line and an optional smaller line under it; returns its centre."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04,rounding_size=0.12", fc=color, ec=edge,
                                lw=1.3))
    if sub:
        ax.text(x + w / 2, y + h * 0.66, title, ha="center", va="center", fontsize=fs, fontweight="bold")
        ax.text(x + w / 2, y + h * 0.28, sub, ha="center", va="center", fontsize=fs - 2.5, color="0.25")
    else:
        ax.text(x + w / 2, y + h / 2, title, ha="center", va="center", fontsize=fs, fontweight="bold")
    return x, y, w, h


def _flow(ax, start, end, kind, text="", dy=0.17, rad=0.0, fs=9):
    """An arrow in the color of when it happens (once, per query tile, at the end), labelled at its middle."""
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color=FLOW[kind], lw=2,
                                                          mutation_scale=16, connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + dy, text, ha="center", va="bottom",
                fontsize=fs, color=FLOW[kind], bbox=dict(fc="white", ec="none", pad=0.6, alpha=0.85))


def fig_backward_dataflow(show: bool = False):
    """One block of bwd_dkdv_split and its key tile K_j, V_j: three bands (global memory, the block's shared
    memory, the warps' registers), the five products of a query tile, and the arrows colored by when they
    happen: once, per query tile i, at the end. Labels come from `kernel_facts`."""
    f = kernel_facts()
    sh = f["shared"]
    fig, ax = plt.subplots(figsize=(15, 9.2))
    ax.set_xlim(0, 16.4)
    ax.set_ylim(-0.9, 10.0)
    ax.axis("off")
    bands = (("global", 0.0, 3.9, "global memory (HBM)"), ("shared", 4.6, 4.3, "shared memory of the block"),
             ("registers", 10.35, 6.05, "registers of its 8 warps"))
    for key, x, w, title in bands:
        ax.add_patch(FancyBboxPatch((x, -0.3), w, 10.1, boxstyle="round,pad=0.02,rounding_size=0.2",
                                    fc=BAND[key], ec="none"))
        ax.text(x + w / 2, 9.5, title, ha="center", va="center", fontsize=13, fontweight="bold")

    # global memory
    gk = _node(ax, 0.25, 8.0, 3.4, 0.95, "K_j, V_j", "this block's B_c keys")
    gq = _node(ax, 0.25, 6.6, 3.4, 0.95, "Q_i, dO_i", "query tile i, B_r rows")
    gl = _node(ax, 0.25, 5.2, 3.4, 0.95, "lse_i, D_i", "forward's lse; D_i = rowsum(dO_i ∘ O_i)")
    gdq = _node(ax, 0.25, 2.0, 3.4, 1.3, "dQ accumulator", "float32 [M × D], every key block\nadds to it; "
                "then dQ = τ · acc", color="#fff6d6")
    gdk = _node(ax, 0.25, 0.0, 3.4, 0.95, "dK_j, dV_j", "written once")
    # shared memory: each box names the arrays and quotes the kernel's comment on them
    sk = _node(ax, 4.85, 8.0, 3.8, 0.95, "sK, sV", f"K_j, V_j {sh['sK']}, loaded once")
    sq = _node(ax, 4.85, 6.6, 3.8, 0.95, "sQ, sdO", f"Q_i, dO_i: {sh['sQ']}")
    sl = _node(ax, 4.85, 5.2, 3.8, 0.95, "sL, sDv", f"lse_i, D_i: {sh['sL']}")
    sp = _node(ax, 4.85, 3.65, 3.8, 0.95, "sP, sdS", f"{sh['sP']}, {sh['sdS']}")
    sdq = _node(ax, 4.85, 2.1, 3.8, 1.1, "sdQ", sh["sdQ"].replace(", ", ",\n", 1), color="#fff6d6")
    # registers: the five products of one query tile, then the accumulators
    rx, rw = 10.55, 5.7
    products = ("① S = Q_i K_jᵀ, P = exp(τS − lse_i)   (recomputed)",
                "② dP = dO_i V_jᵀ,  dS = P ∘ (dP − D_i)",
                "③ dV_j += Pᵀ dO_i",
                "④ dK_j += dSᵀ Q_i",
                "⑤ dQ_i += dS K_j   (this block's share only)")
    ax.add_patch(FancyBboxPatch((rx, 4.05), rw, 4.9, boxstyle="round,pad=0.04,rounding_size=0.12", fc="white",
                                ec="0.35", lw=1.3))
    ax.text(rx + rw / 2, 8.62, "per query tile i: five products", ha="center", fontsize=11, fontweight="bold")
    for n, line in enumerate(products):
        ax.text(rx + 0.2, 8.0 - 0.72 * n, line, fontsize=10.5, va="center")
    ax.text(rx + 0.2, 4.45, "(the kernel computes Sᵀ = K_j Q_iᵀ and dPᵀ = V_j dO_iᵀ:\n"
            "the keys are the rows of its mma)", fontsize=8.5, va="center", color="0.3")
    _node(ax, rx, 0.0, rw, 1.6, f"registers {', '.join(f['accumulators'])}: dV_j, dK_j",
          "accumulated over every query tile;\nthey leave the registers once, when the loop ends",
          color="#dff0e4", edge=FLOW["at the end"])

    def right(b, dy=0.0):
        return b[0] + b[2], b[1] + b[3] / 2 + dy

    def left(b, dy=0.0):
        return b[0], b[1] + b[3] / 2 + dy

    _flow(ax, right(gk), left(sk), "once", "cp.async, once")
    _flow(ax, right(gq), left(sq), "per tile", "cp.async, per tile")
    _flow(ax, right(gl), left(sl), "per tile", "per tile")
    _flow(ax, right(sk), (rx, 8.05), "per tile", "ldmatrix", dy=0.06)
    _flow(ax, right(sq), (rx, 7.5), "per tile", "ldmatrix", dy=0.06)
    _flow(ax, right(sl), (rx, 7.0), "per tile", "lse_i, D_i for ① ②", dy=-0.45)
    _flow(ax, (rx, 4.95), right(sp, 0.25), "per tile", "stmatrix Pᵀ, dSᵀ", dy=0.1)
    _flow(ax, right(sp, -0.25), (rx, 4.4), "per tile", "ldmatrix for ③ ④ ⑤", dy=-0.48)
    _flow(ax, (rx + 0.9, 4.05), right(sdq), "per tile", "⑤'s result, st.shared", dy=-0.42, rad=-0.25)
    _flow(ax, left(sdq), right(gdq, -0.05), "per tile", "bulk add", dy=0.08)
    ax.text(4.45, 1.55, f"sdQ → accumulator: one {f['bulk']} per query tile;\nthe copy engine reads sdQ and adds "
            f"it into global memory (after {f['fence']})", ha="center", va="center", fontsize=8.5,
            color=FLOW["per tile"])
    _flow(ax, (rx, 0.5), right(gdk), "at the end", "written once (dK_j × τ)", dy=0.08)
    ax.text(8.2, -0.65, f"Other paths: {f['red']} from every thread (no sdQ; other GPUs, layout 1), or no dQ "
            "here at all (deterministic mode: a separate dQ kernel loops over the key tiles).",
            ha="center", fontsize=9, color="0.25")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in FLOW.items()], loc="upper center",
              bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=10, frameon=False, title="when an arrow happens",
              title_fontsize=10)
    ax.set_title("The backward for one key tile: dK_j, dV_j stay in registers, dQ_i travels "
                 "(kernels/v6_backward.cu, bwd_dkdv_split)", fontsize=13, loc="left")
    return show_or_return(fig, show)


FIGURES = {"backward_dataflow": fig_backward_dataflow}

