"""The numeric precision a policy runs in: ``auto`` decided once per process, from the device and the CPU's units.

bf16 is how the policy is served and trained wherever the hardware computes it natively: on CUDA, and on CPUs with
AVX-512 BF16 or AMX (``avx512_bf16`` / ``amx_bf16`` in ``/proc/cpuinfo``): on these machines' AVX-512 BF16 a bare
forward and backward of SmolLM2-135M runs 2.1× faster under bf16 autocast than in float32, an A-RIDE update 1.8×
(2.6× with the shared prompt prefix computed once; docs/design.md §8, ``bench/results/precision.json``). Elsewhere
bf16 is emulated and slower than float32, so ``auto`` takes float32 there. :func:`choose_precision` is the rule,
free of the machine's state so that it is checked without a GPU; :func:`resolve_precision` applies it to this
machine.

The learner keeps float32 master weights for the LoRA adapter, its optimiser state and every loss (Retrace targets,
advantages, priorities): bf16 is the precision of the forward pass only (docs/learner.md, "Precision").
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import torch

log = logging.getLogger(__name__)

Precision = Literal["bfloat16", "float32"]

# CPU flags of native bf16 arithmetic: AVX-512 BF16 (dot products) and AMX (tile matrix multiply).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def choose_precision(requested: str, *, device_type: str, cpu_flags: Iterable[str]) -> Precision:
    """``requested`` when it names a precision; for ``auto``, bfloat16 on CUDA and on a CPU with native bf16 units,
    float32 elsewhere.

    Args:
        requested: ``auto``, ``bfloat16`` or ``float32``.
        device_type: ``cuda`` or ``cpu`` (a torch device type; vLLM's ``gpu`` counts as ``cuda``).
        cpu_flags: the CPU's feature flags (``/proc/cpuinfo``'s ``flags`` line).

    Raises:
        ValueError: another ``requested``.
    """
    if requested in ("bfloat16", "float32"):
        return requested  # type: ignore[return-value]
    if requested != "auto":
        raise ValueError(f"precision {requested!r}: choose auto, bfloat16 or float32")
    if device_type in ("cuda", "gpu") or BF16_CPU_FLAGS & set(cpu_flags):
        return "bfloat16"
    return "float32"


@functools.cache
def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` is unreadable: then ``auto`` means float32)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def resolve_precision(requested: str, device_type: str, *, role: str) -> Precision:
    """:func:`choose_precision` on this machine, logged once per role and choice (the decision is printed at start).

    Args:
        requested: the setting (``learner.dtype`` or ``inference.dtype``).
        device_type: where the role computes.
        role: who decides, for the log line (``learner``, ``inference``).
    """
    chosen = choose_precision(requested, device_type=device_type, cpu_flags=cpu_flags())
    _log_once(role, requested, device_type, chosen)
    return chosen


@functools.cache
def _log_once(role: str, requested: str, device_type: str, chosen: Precision) -> None:
    why = ""
    if requested == "auto":
        native = sorted(BF16_CPU_FLAGS & cpu_flags())
        why = " (CUDA)" if device_type in ("cuda", "gpu") else f" (CPU bf16 units: {', '.join(native) or 'none'})"
    log.info("%s precision: %s%s", role, chosen, why)


def torch_dtype(precision: Precision) -> torch.dtype:
    """The torch dtype of a precision."""
    return torch.bfloat16 if precision == "bfloat16" else torch.float32


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager[object]:
    """The context a forward pass runs in: bf16 autocast (weights stay as loaded, float32 master weights on the CPU),
    or nothing for float32."""
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
