"""Every kernel compiles for sm_80, sm_89 and sm_90 (nvcc alone, no GPU), and the compiler's resource
report agrees with results/compile/resources.json: exactly when this nvcc is the one that wrote the record,
otherwise in what the kernels are designed for (no spills, no stack, at least the recorded occupancy)."""
from pathlib import Path

import pytest

import flashattn
from flashattn.loader import version_archs
from flashattn.measure.geometry import launch_of
from flashattn.measure.resources import ARCHS, compile_report, load_record, nvcc_version, occupancy

RECORD = Path(__file__).resolve().parent.parent / "results" / "compile" / "resources.json"
NO_SPILL = {"v3", "v4", "v5", "v6", "v7", "v8"}
REGENERATE = f"regenerate with python -m flashattn.measure.resources --json {RECORD.relative_to(RECORD.parents[2])}"


@pytest.fixture(scope="module")
def record():
    return load_record(RECORD)


def blocks_per_sm(version: str, k: dict) -> int:
    threads, dynamic = launch_of(version, k["name"])
    return occupancy(k["registers"], k.get("static_smem_bytes", 0) + dynamic, threads)["blocks"]


CASES = [(n, a) for n in flashattn.KERNEL_VERSIONS
         for a in ([x.replace(".", "") for x in version_archs(n)] if version_archs(n) else ARCHS)]


@pytest.mark.parametrize("name,arch", CASES)
def test_compiles_and_matches_record(name, arch, record):
    nvcc, recorded = record
    kernels = compile_report(name, arch)
    assert kernels, f"ptxas reported no kernels for {name}"
    for k in kernels:
        assert "registers" in k, k
        if name in NO_SPILL:
            assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0, f"{name} spills: {k}"
            assert k["stack_bytes"] == 0, f"{name} uses a stack frame: {k}"
    expected = recorded[name][f"sm_{arch}"]
    if nvcc is not None and nvcc == nvcc_version():
        assert kernels == expected, f"{name} sm_{arch} resource usage changed; {REGENERATE}"
        return
    # another nvcc allocates registers its own way: the kernels must still fit as many blocks per SM
    assert sorted(k["name"] for k in kernels) == sorted(k["name"] for k in expected), REGENERATE
    by_name = {k["name"]: k for k in expected}
    for k in kernels:
        want = blocks_per_sm(name, by_name[k["name"]])
        assert blocks_per_sm(name, k) >= want, (f"{name} sm_{arch} {k['name']}: {k['registers']} registers "
                                                f"fit fewer than the recorded {want} blocks per SM")


def test_record_names_its_nvcc(record):
    nvcc, recorded = record
    assert nvcc and nvcc.count(".") == 2, f"the record does not say which nvcc wrote it; {REGENERATE}"
    assert set(flashattn.KERNEL_VERSIONS) <= set(recorded)


def test_v3_v4_fit_three_blocks_per_sm(record):
    """The register and shared-memory arithmetic the v3/v4 chapters rely on (sm_90: 64K registers)."""
    for name in ("v3", "v4"):
        (k,) = record[1][name]["sm_90"]
        assert blocks_per_sm(name, k) >= 3, k
        assert k["static_smem_bytes"] <= 48 * 1024
