"""The one check of weight-version events every reader of ``{run}.weights`` runs (servers and collectors)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from distrl_stream.artifacts.weights import base_mismatch, check_version_event
from distrl_stream.errors import WeightEventError
from distrl_stream.kafka.dlq import reason
from distrl_stream.testing.samples import sample_weight_version


def test_the_learners_own_events_pass() -> None:
    rng = random.Random(0)
    for version in (1, 2, 500):
        check_version_event(sample_weight_version(rng, version=version))
    file_event = dataclasses.replace(sample_weight_version(rng), adapter_uri="file:///data/runs/r/artifacts/p/v1")
    check_version_event(dataclasses.replace(file_event, base_fingerprint=""))  # a v1 event carries none


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"version": 0}, "version below 1"),
        ({"policy_id": ""}, "no policy id"),
        ({"sha256": "ab" * 16}, "sha256 'abab"),
        ({"sha256": "Z" * 64}, "is not 64 hex digits"),
        ({"base_fingerprint": "not-a-digest"}, "base fingerprint 'not-a-digest'"),
        ({"size_bytes": 0}, "size 0 bytes"),
        ({"learner_step": -1}, "negative learner step"),
        ({"adapter_uri": ""}, "no adapter URI"),
        ({"adapter_uri": "kafka://r.artifacts/zero/1-2?artifact=p/v000001&chunks=2"}, "malformed kafka artifact"),
        ({"adapter_uri": "http://[::1/policy/v1"}, "Invalid IPv6 URL"),
        ({"adapter_uri": "relative/folder"}, "is not an absolute path"),
    ],
)
def test_an_event_that_names_no_usable_version_is_an_impossible_value(change: dict[str, object], why: str) -> None:
    event = dataclasses.replace(sample_weight_version(random.Random(1), version=3), **change)
    with pytest.raises(WeightEventError, match=why.replace("[", r"\[")) as info:
        check_version_event(event)
    assert reason(info.value, b"\x00").startswith("impossible value: weight version ")


def test_another_base_model_is_told_by_its_fingerprint_not_its_folder_name() -> None:
    event = sample_weight_version(random.Random(2))
    ours = "f" * 64
    line = base_mismatch(event, ours, "this collector's model.base is 'tiny-qwen2'")
    assert event.base_model == "tiny-qwen2" and line is not None  # same name, other weights
    assert f"(fingerprint {event.base_fingerprint[:16]}…) but this collector's model.base is 'tiny-qwen2'" in line
    assert line.endswith(f"(fingerprint {'f' * 16}…)")
    assert base_mismatch(event, event.base_fingerprint, "x") is None
    assert base_mismatch(dataclasses.replace(event, base_fingerprint=""), ours, "x") is None  # v1 events: unchecked
