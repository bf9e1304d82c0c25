"""Runs every plain read of decode_bench's floor part, timed and checking, on a buffer whose last block's share
ends inside a chunk; tests/test_read_floor.py runs this file under compute-sanitizer."""
import torch

from flashattn.measure import read_floor
from flashattn.measure.decode_bench import PLAIN_READS

if __name__ == "__main__":
    x = torch.randn(1_000_004, device="cuda")
    for label, kernel, kw in PLAIN_READS:
        for check in (False, True):
            getattr(read_floor, kernel)(x, check=check, **kw)
        torch.cuda.synchronize()
        print("ran", label, flush=True)
