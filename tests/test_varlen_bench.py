"""flashattn.measure.varlen_bench without a GPU: the padded copy, the FLOP count and the refusal to run."""
from __future__ import annotations

import itertools
import threading

import pytest
import torch

from flashattn.measure import varlen_bench as vb


def test_padded_puts_each_sequence_at_the_start_of_its_row_and_zeros_after():
    lengths = (3, 0, 1, 5)
    packed = torch.arange(sum(lengths) * 2 * 4, dtype=torch.float32).reshape(sum(lengths), 2, 4) + 1
    out = vb.padded(packed, lengths)
    assert out.shape == (4, 2, 5, 4)
    starts = [0, *itertools.accumulate(lengths)]
    for i, n in enumerate(lengths):
        assert torch.equal(out[i, :, :n], packed[starts[i]:starts[i] + n].transpose(0, 1))
        assert not out[i, :, n:].any()


def test_flops_count_the_packed_work_not_the_padding():
    lengths = (8, 2)
    full = 4 * 3 * (64 + 4) * 16
    assert vb.flops(lengths, 3, 16, False, False) == full
    assert vb.flops(lengths, 3, 16, True, False) == full / 2
    assert vb.flops(lengths, 3, 16, True, True) == 2.5 * full / 2


def test_the_issue_batch_and_columns():
    assert vb.LENGTHS == (8192, 4096, 1000, 513, 17, 1, 2048, 300)
    assert (vb.H_Q, vb.H_KV, vb.D) == (32, 8, 128)
    assert set(vb.BACKENDS) <= set(vb.COLUMNS) and "fa4" in vb.COLUMNS


def test_without_a_gpu_it_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        vb.main(["--out", "/tmp/unused"])


def test_the_wall_mode_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        vb.main(["--wall"])


def test_the_per_sequence_column_is_a_backward_step():
    assert vb.COLUMNS.index("ours_per_sequence") == vb.COLUMNS.index("ours") + 1
    assert vb.BACKWARD_ONLY == ("ours_per_sequence",)


def test_per_sequence_backward_reaches_autograds_own_thread():
    """autograd runs a CUDA backward on its device thread, not the caller's: the switch must be seen there
    (a thread-local one was not, and the first run of the column timed the single launch twice)."""
    from flashattn import varlen_kernel as vk
    seen = []
    reader = lambda: seen.append(vk._PER_SEQUENCE["on"])   # noqa: E731
    with vk.per_sequence_backward():
        t = threading.Thread(target=reader)
        t.start()
        t.join()
    reader()
    assert seen == [True, False]
