"""Every kernel compiles for sm_80, sm_89 and sm_90 (nvcc alone, no GPU), and the compiler's resource
report is what results/compile/resources.json records."""
import json
from pathlib import Path

import pytest

import flashattn
from flashattn.resources import ARCHS, compile_report, occupancy

RECORD = Path(__file__).resolve().parent.parent / "results" / "compile" / "resources.json"
NO_SPILL = {"v3", "v4", "v5", "v6"}


@pytest.fixture(scope="module")
def recorded():
    return json.loads(RECORD.read_text())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", flashattn.KERNEL_VERSIONS)
def test_compiles_and_matches_record(name, arch, recorded):
    kernels = compile_report(name, arch)
    assert kernels, f"ptxas reported no kernels for {name}"
    for k in kernels:
        assert "registers" in k, k
        if name in NO_SPILL:
            assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0, f"{name} spills: {k}"
    assert kernels == recorded[name][f"sm_{arch}"], (
        f"{name} sm_{arch} resource usage changed; regenerate with "
        f"python -m flashattn.resources --json {RECORD.relative_to(RECORD.parents[2])}")


def test_v3_v4_fit_three_blocks_per_sm(recorded):
    """The register and shared-memory arithmetic the v3/v4 chapters rely on (sm_90: 64K registers)."""
    for name in ("v3", "v4"):
        (k,) = recorded[name]["sm_90"]
        assert occupancy(k["registers"], k["static_smem_bytes"], 256)["blocks"] >= 3, k
        assert k["static_smem_bytes"] <= 48 * 1024
