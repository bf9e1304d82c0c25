"""The training demonstration's data: the book itself, read character by character.

The corpus is the markdown cells of book/*.ipynb (the prose, not the code), then book/*.md, then README.md;
the first 90% of each document is the training split, the last 10% of each the validation split.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from flashattn.loader import REPO_ROOT


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
