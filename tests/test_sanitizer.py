"""compute-sanitizer memcheck and racecheck are clean for every kernel (small and odd shapes)."""
import pytest
from conftest import run_sanitized
from sanitizer_target import head_dims

import flashattn

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built():
    for version in flashattn.KERNEL_VERSIONS:  # build outside the sanitizer: nvcc under it is slow
        flashattn.load(version)


@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_sanitizer_clean(built, tool):
    """One sanitized process per tool runs every kernel (starting CUDA under the sanitizer is the slow
    part)."""
    out, ran = run_sanitized(tool, "sanitizer_target.py")
    for version in flashattn.KERNEL_VERSIONS:
        for D in head_dims(flashattn.INFO[version]):   # every head dim the kernel has its own code for
            assert any(line.startswith(f"ran {version} ") and line.endswith(f" D={D}") for line in ran), \
                f"{version} at D={D} did not run under {tool}"
