"""The training demonstration's model: a plain GPT-style decoder whose attention is one pluggable function.

Token and position embeddings, pre-norm blocks of causal self-attention and an MLP, a tied output layer; the
attention is a function of q, k, v [B, H, T, D], one of ATTEND:

* ``flashattn``: this project's operator, ``flashattn.attention(q, k, v, causal=True)``, whose backward is
  kernels/v6_backward.cu (CUDA only);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` with PyTorch's own
  backend choice;
* ``sdpa_fp32``: the same call on float32 copies of q, k, v with autocast off. It is the yardstick for
  "the noise of bf16": how far PyTorch's own bf16 attention moves the loss from a float32 attention;
* ``flashattn_hopper``: ``flashattn.attention(..., version="v8", backward="v8_backward")``, V8's forward and
  kernels/v8_backward.cu (Hopper only), trained only when asked for (``--attn``).

`build_model` draws the weights from the config's seed alone, so every attention starts from the same ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from flashattn import attention


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


def _on_the_gpu(q, attn: str) -> None:
    if q.device.type != "cuda":
        raise ValueError(f"attn={attn!r} needs CUDA tensors (the kernels run on the GPU); use attn='sdpa' on CPU")


def attend_flashattn(q, k, v):
    _on_the_gpu(q, "flashattn")
    return attention(q, k, v, causal=True)


def attend_flashattn_hopper(q, k, v):
    """V8's forward and kernels/v8_backward.cu (Hopper only): --attn to compare a training step on it with the
    default's (V6 both ways) and SDPA's."""
    _on_the_gpu(q, "flashattn_hopper")
    return attention(q, k, v, causal=True, version="v8", backward="v8_backward")


ATTEND = {"sdpa": attend_sdpa, "flashattn": attend_flashattn, "sdpa_fp32": attend_sdpa_fp32,
          "flashattn_hopper": attend_flashattn_hopper}
ATTENTIONS = ("sdpa", "flashattn", "sdpa_fp32")   # what the demo trains side by side unless told otherwise


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
