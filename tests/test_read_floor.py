"""flashattn.measure.read_floor: the plain read kernels that decode_bench's floor part times read every byte of
their buffer once (their checksums add up its 32-bit words), at sizes that end inside a chunk and a block's
share; their arguments are refused before any launch."""
import pytest
import torch
from conftest import run_sanitized

from flashattn.measure import read_floor
from flashattn.measure.decode_bench import PLAIN_READS

gpu = pytest.mark.gpu


def _buffer(words: int, ones: bool):
    """`words` float32 words: all 1 (every block's float32 sum is then exact), or random."""
    return torch.ones(words, device="cuda") if ones else torch.randn(words, device="cuda")


@gpu
@pytest.mark.parametrize("words", [4, 1_000_004, 3_333_332])
@pytest.mark.parametrize("label", [label for label, _, _ in PLAIN_READS])
def test_reads_every_word(label, words):
    kernel, kw = next((k, kw) for name, k, kw in PLAIN_READS if name == label)
    fn = getattr(read_floor, kernel)
    x = _buffer(words, ones=True)
    assert fn(x, check=False, **kw) is None
    sums = fn(x, check=True, **kw)
    assert sums.sum().item() == words                     # each word once: no word missed or read twice
    y = _buffer(words, ones=False)
    got, want = fn(y, check=True, **kw).double().sum().item(), read_floor.word_sum(y)
    assert abs(got - want) <= 1e-4 * y.abs().sum().item()


def test_plain_reads_fit_shared_memory():
    for label, kernel, kw in PLAIN_READS:
        if kernel == "bulk":
            assert 128 + kw["chunk"] * kw["stages"] <= 227 * 1024, label


@pytest.mark.parametrize("bad, message", [
    (dict(kernel="loads", unroll=3), "unroll must be 4 or 8"),
    (dict(kernel="bulk", chunk=24), "chunk must be a multiple of 16"),
    (dict(kernel="bulk", chunk=65536, stages=4), "fit in 227 KB"),
    (dict(kernel="loads", blocks=0), "blocks must be >= 1"),
    (dict(kernel="loads", cpu=True), "contiguous CUDA tensor")])
def test_refused_before_launch(bad, message):
    kernel = bad.pop("kernel")
    x = torch.zeros(64) if bad.pop("cpu", False) or not torch.cuda.is_available() else torch.zeros(64, device="cuda")
    bad.setdefault("blocks", 2)
    with pytest.raises(ValueError, match=message):
        getattr(read_floor, kernel)(x, **bad)


@gpu
def test_sanitizer_clean():
    read_floor.module()                                   # built outside the sanitizer: nvcc under it is slow
    for tool in ("memcheck", "racecheck", "synccheck"):
        _, ran = run_sanitized(tool, "read_floor_sanitizer_target.py")
        assert len(ran) == len(PLAIN_READS), ran
