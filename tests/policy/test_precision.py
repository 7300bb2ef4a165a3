"""The precision ``auto`` picks, decided without a GPU: CUDA, a CPU with bf16 units, a CPU without."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distrl_stream.policy.precision import autocast, choose_precision, cpu_flags, torch_dtype

SAPPHIRE_RAPIDS = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
ZEN4 = {"avx512f", "avx512_bf16", "avx512_vnni"}
SKYLAKE = {"avx2", "avx512f", "avx512_vnni"}


@pytest.mark.parametrize(
    ("device", "flags", "expected"),
    [
        ("cuda", set(), "bfloat16"),
        ("gpu", set(), "bfloat16"),  # vLLM's name for it
        ("cpu", SAPPHIRE_RAPIDS, "bfloat16"),
        ("cpu", ZEN4, "bfloat16"),
        ("cpu", {"amx_bf16"}, "bfloat16"),
        ("cpu", SKYLAKE, "float32"),  # bf16 would be emulated there, slower than float32
        ("cpu", set(), "float32"),
    ],
)
def test_auto_is_bf16_where_the_hardware_computes_it(device: str, flags: set[str], expected: str) -> None:
    assert choose_precision("auto", device_type=device, cpu_flags=flags) == expected


def test_an_explicit_precision_is_kept_whatever_the_hardware() -> None:
    assert choose_precision("float32", device_type="cuda", cpu_flags=SAPPHIRE_RAPIDS) == "float32"
    assert choose_precision("bfloat16", device_type="cpu", cpu_flags=set()) == "bfloat16"
    with pytest.raises(ValueError, match="'fp8'"):
        choose_precision("fp8", device_type="cpu", cpu_flags=set())


def test_the_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx512_bf16 amx_bf16\n\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx512_bf16", "amx_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_bf16_autocast_runs_matmuls_in_bf16_and_float32_runs_none() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with autocast(torch.device("cpu"), "bfloat16"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "float32"):
        assert (a @ b).dtype == torch.float32
    assert (torch_dtype("bfloat16"), torch_dtype("float32")) == (torch.bfloat16, torch.float32)
