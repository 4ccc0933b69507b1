"""The CPU line `braid run` prints at start: the model, cores and the vector instructions torch and vLLM use."""

from __future__ import annotations

from services.common.cpu import CpuInfo, cpu_info, parse_cpuinfo

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_vnni avx512_bf16 amx_tile amx_bf16

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu
"""
AMD = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma
"""


def test_the_first_processor_names_the_model_and_its_flags():
    model, flags = parse_cpuinfo(INTEL)
    assert model.startswith("Intel(R) Xeon(R) Platinum 8481C") and {"avx512f", "amx_tile"} <= flags
    assert parse_cpuinfo("") == ("", set())


def test_the_line_says_whether_the_cpu_has_avx512():
    intel = CpuInfo("Xeon", 2, ("avx2", "fma", "avx512f", "amx_tile"), "AVX512")
    amd = CpuInfo("AMD EPYC", 2, ("avx2", "fma"), "AVX2")
    assert intel.avx512 and intel.line() == "CPU: Xeon, 2 cores, AVX-512, AMX; torch kernels AVX512"
    assert not amd.avx512 and amd.line() == "CPU: AMD EPYC, 2 cores, AVX2, no AVX-512; torch kernels AVX2"
    assert CpuInfo("old", 1, (), "DEFAULT").line() == "CPU: old, 1 core, no AVX2; torch kernels DEFAULT"
    assert amd.to_json()["avx512"] is False and amd.to_json()["features"] == ("avx2", "fma")


def test_this_machine_reads(tmp_path):
    (tmp_path / "cpuinfo").write_text(AMD)
    info = cpu_info(tmp_path / "cpuinfo")
    assert info.model == "AMD EPYC" and info.features == ("avx2", "fma") and info.cores >= 1
    assert cpu_info(tmp_path / "missing").features == ()  # not Linux: no flags, still a line
