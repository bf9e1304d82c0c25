"""Global offsets past 2^31 elements: the last (batch, head) slice of q starts beyond what a 32-bit
index can address, so a kernel that computes offsets in int writes to the wrong place."""
import pytest
import torch
from conftest import randn

import flashattn
from flashattn.reference import attention_reference, relative_error

pytestmark = pytest.mark.gpu

H, M, N, D = 3, 2**24 + 3, 37, 64  # q holds 3 * (2^24 + 3) * 64 > 2^31 elements (12.9 GB)


@pytest.fixture(scope="module")
def big():
    free, _ = torch.cuda.mem_get_info()
    need = 2 * H * M * D * 4 + (1 << 30)
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory, has {free / 2**30:.0f}")
    q = torch.empty(1, H, M, D, device="cuda")
    q.normal_()
    return q, randn(1, H, N, D), randn(1, H, N, D)


@pytest.mark.parametrize("version", ["v3", "v4", "v5"])
def test_offsets_past_2_31(big, version):
    q, k, v = big
    assert q.numel() > 2**31
    out = flashattn.forward(q, k, v, version=version)
    # Rows whose flat offset lies past 2^31 elements, and a few at the start, against the reference.
    for rows in (slice(M - 300, M), slice(0, 100)):
        ref = attention_reference(q[:, :, rows], k, v)
        assert relative_error(out[:, :, rows], ref) <= 1e-5
    last = out[:, -1, -1000:]
    assert torch.isfinite(last).all()
    del out
