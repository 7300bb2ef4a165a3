"""Where a learner member trains: ``learner.device`` resolved against the GPUs torch sees and the member's place.

A learner group on CUDA talks over NCCL, which needs one GPU per member: member ``LOCAL_RANK`` of a host uses
``cuda:LOCAL_RANK``. :func:`choose_device` is the rule, free of torch's runtime state so that it can be checked
without a GPU; :func:`resolve_device` applies it to this process.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch

from distrl_stream.errors import LearnerError
from distrl_stream.learner.group import Membership

log = logging.getLogger(__name__)

RequestedDevice = Literal["auto", "cpu", "cuda"]


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def choose_device(
    requested: RequestedDevice, *, local_rank: int, local_world_size: int, cuda_count: int
) -> torch.device:
    """The device of one member: the CPU, or ``cuda:local_rank``.

    - ``cpu``: the CPU.
    - ``cuda``: ``cuda:local_rank``; refused when torch sees no GPU, or fewer GPUs than this host has members.
    - ``auto``: as ``cuda`` when torch sees a GPU for every member on this host, else the CPU. When there are GPUs
      but fewer than members, it trains on the CPU and logs a warning rather than failing: every member of the host
      sees the same count, so they all fall back together and the group still agrees on one backend (gloo).

    Args:
        requested: ``learner.device``.
        local_rank: this member's index on its host (torchrun's ``LOCAL_RANK``).
        local_world_size: the members on this host (torchrun's ``LOCAL_WORLD_SIZE``; at least ``local_rank + 1``
            is assumed, so an inconsistent environment cannot pick a GPU that is not there).
        cuda_count: the GPUs torch sees (0 when CUDA is unavailable).

    Raises:
        LearnerError: ``cuda`` was asked for and torch sees no GPU, or fewer GPUs than this host has members.
    """
    if requested == "cpu":
        return torch.device("cpu")
    members = max(local_world_size, local_rank + 1)
    if requested == "cuda" and cuda_count == 0:
        raise LearnerError("learner.device = 'cuda' but torch sees no CUDA device (CPU-only torch, or no GPU visible)")
    if members > cuda_count:
        if requested == "cuda":
            raise LearnerError(
                f"learner.device = 'cuda': {members} members on this node but torch sees {_gpus(cuda_count)}; NCCL "
                f"needs one GPU per member (use --nproc-per-node {cuda_count} or learner.device = 'cpu')"
            )
        if cuda_count > 0:
            log.warning(
                "learner.device = 'auto': %d members on this node but torch sees %s; training on the CPU (NCCL needs "
                "one GPU per member: --nproc-per-node %d trains on the GPU)",
                members,
                _gpus(cuda_count),
                cuda_count,
            )
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def resolve_device(requested: RequestedDevice, membership: Membership) -> torch.device:
    """:func:`choose_device` for this process: its place in the group and the GPUs torch sees.

    Raises:
        LearnerError: as :func:`choose_device`.
    """
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return choose_device(
        requested,
        local_rank=membership.local_rank,
        local_world_size=membership.local_world_size,
        cuda_count=cuda_count,
    )
