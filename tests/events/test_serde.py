"""The Confluent-framed Avro serde: round trips, evolution, malformed input, and Confluent's own deserializer."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import random
import struct
from pathlib import Path

import pytest
from fastavro import schemaless_writer

from distrl_stream.errors import EventDecodeError, EventEncodeError
from distrl_stream.events import (
    EVENT_TYPES,
    DeadLetter,
    MetricEvent,
    Serde,
    Tensor,
    Termination,
    TrajectoryEvent,
    WeightVersionEvent,
    decode,
    default_store,
    encode,
    utc_now,
)
from distrl_stream.testing.samples import sample_dead_letter, sample_metric, sample_trajectory, sample_weight_version

SAMPLES = {
    TrajectoryEvent: sample_trajectory,
    WeightVersionEvent: sample_weight_version,
    MetricEvent: sample_metric,
    DeadLetter: sample_dead_letter,
}


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_every_event_type_round_trips_exactly(cls: type) -> None:
    event = SAMPLES[cls](random.Random(7))
    decoded = decode(encode(event))
    assert type(decoded) is cls
    assert decoded == event


def test_trajectory_round_trip_keeps_optional_fields_enums_and_tensors() -> None:
    trajectory = sample_trajectory(random.Random(3), steps=3)
    first = trajectory.steps[0]
    step = type(first)(
        **{
            **{name: getattr(first, name) for name in first.__slots__},
            "screenshot_uri": "file:///shots/1.png",
            "screenshot_sha256": "ab" * 32,
            "valid": False,
            "action": "",
            "invalid_reason": "unparseable JSON",
            "candidates": [],
            "policy_version": 3,
            "server": "http://gpu-1:8000",
            "adapter_sha256": "cd" * 32,
            "mode": "free",
        }
    )
    event = TrajectoryEvent(
        **{**{n: getattr(trajectory, n) for n in trajectory.__slots__}, "steps": [step], "termination": "env_error"}
    )
    decoded = decode(encode(event), expect=TrajectoryEvent)
    assert decoded.termination is Termination.ENV_ERROR
    assert decoded.steps[0] == step
    assert decoded.steps[0].token_ids.to_numpy().tolist() == first.token_ids.to_numpy().tolist()


def test_wire_format_is_magic_byte_then_big_endian_schema_id() -> None:
    data = encode(sample_weight_version(random.Random(0)))
    assert data[0] == 0
    assert struct.unpack(">I", data[1:5])[0] == Serde().schema_id(WeightVersionEvent) == 6


def test_metric_written_with_version_1_reads_with_version_2_and_gets_the_default_labels() -> None:
    v1 = default_store().by_id(3)
    assert v1 is not None and v1.name == "distrl.MetricEvent" and v1.version == 1
    timestamp = utc_now()
    body = io.BytesIO()
    schemaless_writer(
        body, v1.parsed, {"run": "r", "role": "learner", "source_id": "l0", "timestamp": timestamp, "values": {"x": 1}}
    )
    event = decode(b"\x00" + struct.pack(">I", v1.id) + body.getvalue())
    assert event == MetricEvent(
        run="r", role="learner", source_id="l0", timestamp=timestamp, values={"x": 1.0}, labels={}
    )


def test_weight_version_written_with_version_1_reads_with_version_2_without_a_fingerprint() -> None:
    v1 = default_store().by_id(2)
    assert v1 is not None and v1.name == "distrl.WeightVersionEvent" and v1.version == 1
    current = sample_weight_version(random.Random(0))
    old = {k: v for k, v in current.to_avro().items() if k != "base_fingerprint"}
    body = io.BytesIO()
    schemaless_writer(body, v1.parsed, old)
    event = decode(b"\x00" + struct.pack(">I", v1.id) + body.getvalue())
    assert event == dataclasses.replace(current, base_fingerprint="")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (None, "empty"),
        (b"\x00\x00\x00", "too short"),
        (b"garbage that is not an event", "bad magic byte"),
        (b"\x01\x00\x00\x00\x01payload", "bad magic byte"),
        (b"\x00\x00\x00\x30\x39payload", "unknown schema id"),
    ],
    ids=["empty", "null", "short", "garbage", "wrong-magic", "unknown-id"],
)
def test_malformed_input_raises_the_typed_error_naming_the_problem(data: bytes | None, reason: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode(data)
    assert info.value.reason == reason
    assert reason in str(info.value)


@pytest.mark.parametrize("keep", [5, 6, 40, 0.5, -1], ids=["header-only", "1-byte", "40-bytes", "half", "minus-1"])
def test_truncated_record_raises_truncated(keep: float) -> None:
    data = encode(sample_trajectory(random.Random(1), steps=4))
    cut = int(len(data) * keep) if isinstance(keep, float) else (keep if keep > 0 else len(data) + keep)
    with pytest.raises(EventDecodeError) as info:
        decode(data[:cut])
    assert info.value.reason == "truncated"
    assert info.value.schema_id == Serde().schema_id(TrajectoryEvent)


def test_bytes_after_the_record_are_an_error() -> None:
    data = encode(sample_metric(random.Random(1)))
    with pytest.raises(EventDecodeError) as info:
        decode(data + b"\x00\x01")
    assert info.value.reason == "trailing bytes"


def test_corrupt_body_raises_malformed_or_truncated() -> None:
    data = bytearray(encode(sample_metric(random.Random(1))))
    data[6:12] = b"\xff\xfe\xfd\xfc\xfb\xfa"  # inside the run string: invalid UTF-8 / lengths
    with pytest.raises(EventDecodeError) as info:
        decode(bytes(data))
    assert info.value.reason in {"malformed", "truncated", "trailing bytes"}


def test_decode_with_expect_refuses_another_event_type() -> None:
    data = encode(sample_metric(random.Random(1)))
    with pytest.raises(EventDecodeError) as info:
        decode(data, expect=TrajectoryEvent)
    assert info.value.reason == "unexpected type"
    assert "MetricEvent" in str(info.value)


def test_encoding_a_wrong_field_type_raises_encode_error_naming_the_event() -> None:
    bad = MetricEvent(run="r", role="x", source_id="s", timestamp=utc_now(), values={"v": "not a number"})  # type: ignore[dict-item]
    with pytest.raises(EventEncodeError, match="MetricEvent"):
        encode(bad)


def test_encoding_a_non_event_raises_encode_error() -> None:
    with pytest.raises(EventEncodeError, match="not an event"):
        encode({"run": "r"})  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_confluent_avro_deserializer_reads_what_we_write(cls: type) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    # An empty mock registry numbers schemas 1, 2, ... in registration order: registering ours in id order
    # gives it exactly our ids (the same procedure seeds a real, empty Schema Registry).
    registry = SchemaRegistryClient.new_client({"url": "mock://distrl-test"})
    store = {entry.id: entry for entry in default_store()}
    for schema_id in range(1, max(store) + 1):
        entry = store[schema_id]
        assert registry.register_schema(f"{entry.name}-v{entry.version}", Schema(entry.schema_str, "AVRO")) == schema_id
    event = SAMPLES[cls](random.Random(11))
    record = AvroDeserializer(registry)(encode(event), SerializationContext("t", MessageField.VALUE))
    assert cls.from_avro(record) == event


def test_trajectory_keeps_a_truncated_episode_s_final_observation() -> None:
    trajectory = dataclasses.replace(
        sample_trajectory(random.Random(4), steps=2),
        termination=Termination.TRUNCATED,
        final_observation="[0] button Shutter",
        final_candidates=['{"action_type":"click","index":0}'],
    )
    assert decode(encode(trajectory), expect=TrajectoryEvent) == trajectory


def test_trajectory_written_with_version_1_reads_with_version_2_with_the_new_fields_defaulted() -> None:
    v1 = default_store().by_id(1)
    assert v1 is not None and v1.name == "distrl.TrajectoryEvent" and v1.version == 1
    trajectory = sample_trajectory(random.Random(5), steps=2)
    body = io.BytesIO()
    record = trajectory.to_avro()
    for added in ("final_observation", "final_candidates"):
        del record[added]
    for step in record["steps"]:
        del step["server"], step["adapter_sha256"]
    schemaless_writer(body, v1.parsed, record)
    event = decode(b"\x00" + struct.pack(">I", v1.id) + body.getvalue(), expect=TrajectoryEvent)
    # The defaults: no final observation and no candidates; steps with no server and no adapter sha256.
    steps = [dataclasses.replace(s, server="", adapter_sha256=None) for s in trajectory.steps]
    assert event == dataclasses.replace(trajectory, steps=steps)
    assert (event.final_observation, event.final_candidates) == (None, [])
    assert [(s.server, s.adapter_sha256) for s in event.steps] == [("", None), ("", None)]


def test_prompt_token_ids_round_trip_in_the_narrowest_integer_type() -> None:
    trajectory = sample_trajectory(random.Random(6), steps=2)
    small, large = [0, 1, 49151, 65535], [0, 151_643, 7]
    steps = [
        dataclasses.replace(trajectory.steps[0], prompt_token_ids=Tensor.from_token_ids(small)),
        dataclasses.replace(trajectory.steps[1], prompt_token_ids=Tensor.from_token_ids(large)),
    ]
    event = decode(encode(dataclasses.replace(trajectory, steps=steps)), expect=TrajectoryEvent)
    first, second = (s.prompt_token_ids for s in event.steps)
    assert first is not None and second is not None
    assert (first.dtype, first.to_numpy().tolist()) == ("uint16", small)  # two bytes a token under 65,536
    assert (second.dtype, second.to_numpy().tolist()) == ("int32", large)
    assert len(first.data) == 2 * len(small)


def test_trajectories_written_with_version_2_read_with_version_3_without_prompt_ids() -> None:
    """The committed sample of records written before Step.prompt_token_ids (tests/learner/data)."""
    sample = json.loads((Path(__file__).parents[1] / "learner" / "data" / "trajectories_v2.json").read_text())
    blobs = [base64.b64decode(b) for b in sample["events"]]
    assert {struct.unpack(">I", b[1:5])[0] for b in blobs} == {sample["schema_id"]} == {7}
    events = [decode(b, expect=TrajectoryEvent) for b in blobs]
    assert all(s.prompt_token_ids is None for e in events for s in e.steps)
    assert all(s.server == "" and s.token_ids.dtype == "int32" for e in events for s in e.steps)
    assert all(s.mode is None for e in events for s in e.steps)
    # Written again, they are records of the newest version.
    assert {struct.unpack(">I", encode(e)[1:5])[0] for e in events} == {9}
