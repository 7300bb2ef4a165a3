"""learner.device against the GPUs torch sees and the member's place on its host (no GPU needed)."""

from __future__ import annotations

import logging

import pytest
import torch

from distrl_stream.errors import LearnerError
from distrl_stream.learner.device import RequestedDevice, choose_device, resolve_device
from distrl_stream.learner.group import Membership

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("requested", "local_rank", "local_world_size", "cuda_count", "expected"),
    [
        ("cpu", 0, 1, 0, CPU),
        ("cpu", 1, 2, 2, CPU),  # GPUs are there, but the CPU was asked for
        ("auto", 0, 1, 0, CPU),
        ("auto", 0, 1, 1, torch.device("cuda", 0)),
        ("auto", 1, 2, 2, torch.device("cuda", 1)),
        ("cuda", 0, 1, 1, torch.device("cuda", 0)),
        ("cuda", 0, 1, 2, torch.device("cuda", 0)),
        ("cuda", 0, 2, 2, torch.device("cuda", 0)),
        ("cuda", 1, 2, 2, torch.device("cuda", 1)),
    ],
)
def test_each_member_gets_the_cpu_or_the_gpu_of_its_local_rank(
    requested: RequestedDevice, local_rank: int, local_world_size: int, cuda_count: int, expected: torch.device
) -> None:
    device = choose_device(requested, local_rank=local_rank, local_world_size=local_world_size, cuda_count=cuda_count)
    # torch.device("cuda") != torch.device("cuda", 0): an unindexed GPU fails here.
    assert device == expected


def test_cuda_without_a_gpu_is_refused_in_one_line_naming_the_setting() -> None:
    with pytest.raises(LearnerError) as err:
        choose_device("cuda", local_rank=0, local_world_size=1, cuda_count=0)
    message = str(err.value)
    assert message.startswith("learner.device = 'cuda'") and "no CUDA device" in message
    assert "\n" not in message


@pytest.mark.parametrize("local_rank", [0, 1])
def test_cuda_with_more_members_on_the_host_than_gpus_is_refused_on_every_member(local_rank: int) -> None:
    with pytest.raises(LearnerError) as err:
        choose_device("cuda", local_rank=local_rank, local_world_size=2, cuda_count=1)
    message = str(err.value)
    assert message == (
        "learner.device = 'cuda': 2 members on this node but torch sees 1 GPU; NCCL needs one GPU per member "
        "(use --nproc-per-node 1 or learner.device = 'cpu')"
    )


def test_a_local_rank_beyond_the_local_world_size_cannot_pick_a_missing_gpu() -> None:
    with pytest.raises(LearnerError, match="2 members on this node but torch sees 1 GPU"):
        choose_device("cuda", local_rank=1, local_world_size=1, cuda_count=1)


def test_auto_with_more_members_than_gpus_trains_on_the_cpu_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="distrl_stream.learner.device"):
        assert choose_device("auto", local_rank=1, local_world_size=2, cuda_count=1) == CPU
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith(
        "learner.device = 'auto': 2 members on this node but torch sees 1 GPU; training on the CPU"
    )


def test_auto_without_a_gpu_is_the_cpu_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="distrl_stream.learner.device"):
        assert choose_device("auto", local_rank=0, local_world_size=1, cuda_count=0) == CPU
    assert not caplog.records


def test_resolve_device_reads_the_members_place_and_the_gpus_torch_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    member = Membership(rank=3, world_size=4, local_rank=1, local_world_size=2)
    assert resolve_device("cuda", member) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    # Local rank 0 alone would fit on the one GPU: only the host's member count refuses it.
    with pytest.raises(LearnerError, match="2 members on this node"):
        resolve_device("cuda", Membership(rank=2, world_size=4, local_rank=0, local_world_size=2))


def test_resolve_device_counts_no_gpu_when_cuda_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU count is only read once torch says CUDA works.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", Membership()) == CPU
    with pytest.raises(LearnerError, match="no CUDA device"):
        resolve_device("cuda", Membership())


def test_the_members_on_a_host_come_from_torchruns_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert Membership.from_env().local_world_size == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.delenv("LOCAL_RANK")
    assert Membership.from_env().local_world_size == 1
